//! Who owns what podtrace attached, told without PIDs.
//!
//! Several podtraces may trace one node at once, and one of them may have
//! been killed. A PID says nothing across PID namespaces (a podtrace in a
//! container cannot see the host's), so each run has a random id and a
//! file `/run/podtrace/<id>.run` that it holds an exclusive flock(2) on
//! for as long as it lives. The kernel drops the lock when the process
//! dies, SIGKILL included: a run file whose lock can be taken belongs to
//! a dead run.
//!
//! Before attaching anything, a run writes what it is about to own into
//! its file (write-ahead: a kill right after the attach still leaves the
//! record): clsact filters by netns, ifindex, hook, priority and the
//! run's own filter handle; nft tables by netns and name
//! (`podtrace_r<id>`). Every run, in every attach mode, first sweeps the
//! files of dead runs, removes exactly what they recorded, and deletes
//! them. Nothing is removed by name alone, so a live run's filters and
//! tables are never touched. A run also holds a sign of life in each
//! namespace it attaches in (`run_liveness`), for podtraces that cannot
//! see its file (`orphans`).
//!
//! A clsact qdisc podtrace added is marked by a file `qdisc-<netns>-<ifindex>`;
//! whoever removes the last filter from such a qdisc removes it too. A
//! qdisc without the mark, or with any filter left (another run's, another
//! tool's), stays. These steps hold `/run/podtrace/lock` so that no run
//! removes a qdisc another is attaching to.

use std::{
    collections::HashSet,
    fs::{self, File, OpenOptions},
    io::{Read, Write},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
};

use anyhow::{bail, Context, Result};

use crate::node::netns::Namespace;

pub const DIR: &str = "/run/podtrace";

/// Something one run attached in one network namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub netns_inum: u32,
    /// Where the namespace can be entered; None: the run's own.
    pub netns_path: Option<PathBuf>,
    pub held: Held,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    Filter {
        ifindex: u32,
        ifname: String,
        ingress: bool,
        priority: u16,
        handle: u32,
    },
    Table {
        name: String,
    },
}

impl Record {
    pub fn at(netns: &Namespace, held: Held) -> Self {
        Self {
            netns_inum: netns.inum,
            netns_path: netns.path.clone(),
            held,
        }
    }

    /// One line; the path last, since it may hold spaces.
    fn line(&self) -> String {
        let path = self
            .netns_path
            .as_ref()
            .map_or("-".into(), |p| p.display().to_string());
        let inum = self.netns_inum;
        match &self.held {
            Held::Filter {
                ifindex,
                ifname,
                ingress,
                priority,
                handle,
            } => {
                let hook = if *ingress { "ingress" } else { "egress" };
                format!("filter {inum} {ifindex} {ifname} {hook} {priority} {handle} {path}")
            }
            Held::Table { name } => format!("table {inum} {name} {path}"),
        }
    }

    fn parse(line: &str) -> Option<Self> {
        let (kind, rest) = line.split_once(' ')?;
        let fields = if kind == "filter" { 5 } else { 1 };
        let mut parts = rest.splitn(fields + 2, ' ');
        let netns_inum = parts.next()?.parse().ok()?;
        let values: Vec<&str> = parts.by_ref().take(fields).collect();
        let path = parts.next()?;
        let held = match (kind, values.as_slice()) {
            ("filter", [ifindex, ifname, hook, priority, handle]) => Held::Filter {
                ifindex: ifindex.parse().ok()?,
                ifname: ifname.to_string(),
                ingress: *hook == "ingress",
                priority: priority.parse().ok()?,
                handle: handle.parse().ok()?,
            },
            ("table", [name]) => Held::Table {
                name: name.to_string(),
            },
            _ => return None,
        };
        Some(Self {
            netns_inum,
            netns_path: (path != "-").then(|| PathBuf::from(path)),
            held,
        })
    }
}

/// This run: its id, its locked file, what it holds.
struct Run {
    id: u64,
    path: PathBuf,
    file: File,
    records: Vec<Record>,
    /// This run's sign of life in each namespace it attaches in, by inode
    /// (`run_liveness`).
    alive_in: Vec<(u32, std::os::unix::net::UnixDatagram)>,
}

static RUN: Mutex<Option<Run>> = Mutex::new(None);
/// Ids of dead runs this run swept (their files are gone by now).
static DEAD: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
static SWEPT: AtomicBool = AtomicBool::new(false);

fn with_run<T>(f: impl FnOnce(&mut Run) -> Result<T>) -> Result<T> {
    let mut run = RUN.lock().unwrap_or_else(|e| e.into_inner());
    if run.is_none() {
        *run = Some(Run::register().context("cannot register this run in /run/podtrace")?);
    }
    f(run.as_mut().expect("registered"))
}

impl Run {
    fn register() -> Result<Self> {
        fs::create_dir_all(DIR)?;
        let id = random_id()?;
        let path = run_path(id);
        // Locked under a name no sweep reads, then renamed: a sweep must
        // never see the file unlocked.
        let staging = Path::new(DIR).join(format!("{id:016x}.new"));
        let file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&staging)?;
        flock(&file, libc::LOCK_EX | libc::LOCK_NB)?;
        fs::rename(&staging, &path)?;
        Ok(Self {
            id,
            path,
            file,
            records: Vec::new(),
            alive_in: Vec::new(),
        })
    }

    fn write(&mut self) -> Result<()> {
        let text: String = self.records.iter().map(|r| r.line() + "\n").collect();
        use std::os::unix::fs::FileExt;
        self.file.set_len(0)?;
        self.file.write_all_at(text.as_bytes(), 0)?;
        Ok(())
    }
}

fn run_path(id: u64) -> PathBuf {
    Path::new(DIR).join(format!("{id:016x}.run"))
}

#[cfg(target_os = "linux")]
fn random_id() -> Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: writes at most 8 bytes into a buffer of 8.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), 8, 0) };
    if n != 8 {
        bail!("getrandom: {}", std::io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(bytes))
}

#[cfg(not(target_os = "linux"))]
fn random_id() -> Result<u64> {
    Err(crate::model::needs_linux("a run's registry"))
}

fn flock(file: &File, how: i32) -> std::io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    if unsafe { libc::flock(file.as_raw_fd(), how) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// This run's id (registering the run on first use).
pub fn id() -> Result<u64> {
    with_run(|run| Ok(run.id))
}

/// The filter handle of this run's clsact filters: its own, so that
/// removing them by (priority, handle) removes nobody else's. Below
/// 0x8000_0000, where the kernel hands out handles of its own choosing.
pub fn filter_handle() -> Result<u32> {
    Ok(handle_of(id()?))
}

/// The filter handle of the run with this id, which also names its sign
/// of life (`run_liveness`).
pub fn handle_of(id: u64) -> u32 {
    (id as u32 & 0x7fff_ffff).max(1)
}

/// Records what this run is about to attach, before it attaches it, and
/// says this run lives in the record's namespace (once per namespace), so
/// that a podtrace that cannot see this run's file can still tell.
pub fn claim(record: Record) -> Result<()> {
    with_run(|run| {
        if !run.alive_in.iter().any(|(n, _)| *n == record.netns_inum) {
            let mut held = None;
            reach(&record, || {
                held = Some(super::run_liveness::hold(handle_of(run.id))?);
                Ok(())
            })?;
            run.alive_in.extend(held.map(|h| (record.netns_inum, h)));
        }
        run.records.push(record);
        run.write()
    })
}

/// The filter handles of the runs whose files are in /run/podtrace, live
/// or not: those runs are judged by their files, not by their sign of
/// life.
pub fn handles_with_files() -> HashSet<u32> {
    let Ok(dir) = fs::read_dir(DIR) else {
        return HashSet::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let hex = name.strip_suffix(".run")?;
            u64::from_str_radix(hex, 16).ok().map(handle_of)
        })
        .collect()
}

/// Forgets what this run has detached.
pub fn release(record: &Record) {
    let _ = with_run(|run| {
        run.records.retain(|r| r != record);
        run.write()
    });
}

/// At exit: deletes this run's file, unless something could not be
/// detached (then a later run's sweep removes it).
pub fn close() {
    let run = RUN.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(run) = run {
        if run.records.is_empty() {
            let _ = fs::remove_file(&run.path);
        }
    }
}

/// Whether the run with this id is alive, as far as this run can tell.
#[derive(Debug, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    Dead,
    /// No run file: a run in another mount namespace, or an old podtrace.
    Unknown,
}

pub fn liveness(id: u64) -> Liveness {
    if RUN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|r| r.id)
        == Some(id)
    {
        return Liveness::Alive;
    }
    let dead = DEAD.lock().unwrap_or_else(|e| e.into_inner());
    if dead.as_ref().is_some_and(|d| d.contains(&id)) {
        return Liveness::Dead;
    }
    match File::open(run_path(id)) {
        Ok(file) if flock(&file, libc::LOCK_SH | libc::LOCK_NB).is_ok() => Liveness::Dead,
        Ok(_) => Liveness::Alive,
        Err(_) => Liveness::Unknown,
    }
}

/// Held while filters are attached or removed and qdiscs decided on.
pub struct Exclusive {
    _lock: File,
}

pub fn exclusive() -> Result<Exclusive> {
    fs::create_dir_all(DIR)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(Path::new(DIR).join("lock"))
        .context("cannot open /run/podtrace/lock")?;
    flock(&file, libc::LOCK_EX).context("cannot lock /run/podtrace/lock")?;
    Ok(Exclusive { _lock: file })
}

/// How one record of a dead run is removed (by `sweep`, which knows the
/// filters and tables a record can hold).
pub type Remover = fn(&Exclusive, &Record) -> Result<()>;

/// Once per process, before the first attach: removes what dead runs
/// recorded (each by `remove`, in its namespace), and their files.
pub fn sweep_dead_runs(remove: Remover) -> Result<()> {
    if SWEPT.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let lock = exclusive()?;
    let own = id()?;
    let Ok(dir) = fs::read_dir(DIR) else {
        return Ok(());
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_suffix(".run")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            sweep_gone_marks(&name, &entry.path());
            continue;
        };
        if id != own {
            sweep_one(&lock, id, &entry.path(), remove);
        }
    }
    Ok(())
}

/// One run file: left alone while its run lives.
fn sweep_one(lock: &Exclusive, id: u64, path: &Path, remove: Remover) {
    let Ok(mut file) = File::open(path) else {
        return;
    };
    if flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_err() {
        return;
    }
    DEAD.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(id);
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    for record in text.lines().filter_map(Record::parse) {
        let removed = reach(&record, || remove(lock, &record));
        if let Err(e) = removed {
            eprintln!(
                "podtrace: cannot remove what a killed podtrace left ({}): {e:#}",
                record.line()
            );
        }
    }
    // Still the file locked (not a new one under the same name).
    let same = fs::metadata(path).is_ok_and(|m| file.metadata().is_ok_and(|f| f.ino() == m.ino()));
    if same {
        let _ = fs::remove_file(path);
    }
}

/// Runs `f` inside the record's namespace, if it still exists and is
/// reachable from here; a namespace that is gone took everything with it.
fn reach(record: &Record, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let here = fs::metadata("/proc/thread-self/ns/net")?.ino() as u32;
    if record.netns_inum == here {
        return f();
    }
    let Some(path) = &record.netns_path else {
        return Ok(());
    };
    match fs::metadata(path) {
        Ok(m) if m.ino() as u32 == record.netns_inum => Namespace {
            path: Some(path.clone()),
            arg: None,
            inum: record.netns_inum,
        }
        .run(f),
        _ => Ok(()),
    }
}

fn qdisc_mark(netns_inum: u32, ifindex: u32) -> PathBuf {
    Path::new(DIR).join(format!("qdisc-{netns_inum}-{ifindex}"))
}

/// Marks the clsact qdisc of an interface as podtrace's, before adding it.
/// The mark names the namespace's path, for a sweep to tell when it is gone.
pub fn mark_qdisc(_: &Exclusive, netns: &Namespace, ifindex: u32) -> Result<bool> {
    let path = qdisc_mark(netns.inum, ifindex);
    match OpenOptions::new().create_new(true).write(true).open(&path) {
        Ok(mut f) => {
            let at = netns
                .path
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string());
            let _ = writeln!(f, "{at}");
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}

/// Marks of qdiscs in namespaces that are gone (with their qdiscs).
fn sweep_gone_marks(name: &str, path: &Path) {
    let Some(inum) = name
        .strip_prefix("qdisc-")
        .and_then(|r| r.split('-').next())
        .and_then(|i| i.parse::<u64>().ok())
    else {
        return;
    };
    let at = fs::read_to_string(path).unwrap_or_default();
    let at = at.trim();
    if at != "-" && !fs::metadata(at).is_ok_and(|m| m.ino() == inum) {
        let _ = fs::remove_file(path);
    }
}

pub fn qdisc_marked(_: &Exclusive, netns_inum: u32, ifindex: u32) -> bool {
    qdisc_mark(netns_inum, ifindex).exists()
}

pub fn unmark_qdisc(_: &Exclusive, netns_inum: u32, ifindex: u32) {
    let _ = fs::remove_file(qdisc_mark(netns_inum, ifindex));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written() {
        let records = [
            Record {
                netns_inum: 4026532000,
                netns_path: Some("/run/netns/my node".into()),
                held: Held::Filter {
                    ifindex: 7,
                    ifname: "cni0".into(),
                    ingress: false,
                    priority: 1,
                    handle: 0x1234_5678,
                },
            },
            Record {
                netns_inum: 4026531840,
                netns_path: None,
                held: Held::Table {
                    name: "podtrace_r00ff00ff00ff00ff".into(),
                },
            },
        ];
        for record in records {
            assert_eq!(Record::parse(&record.line()), Some(record.clone()));
        }
        assert_eq!(Record::parse("garbage"), None);
        assert_eq!(Record::parse("filter 1 2 eth0 ingress x 3 -"), None);
    }
}
