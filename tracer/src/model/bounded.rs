//! Reading a user's file or a node's file with a bound on its size and
//! on the time it may take: the one home of that logic.
//!
//! Every open is non-blocking, so a FIFO where a file was expected does
//! not block the open; what the open found is asked of the open file
//! (fstat), so nothing can be swapped in between. [`read_regular`] reads
//! only regular files and names anything else (a FIFO, a character
//! device such as /dev/zero). [`Stream`] also takes a FIFO or a pipe
//! (`--pods-file <(kubectl get pods -A -o json)`) for a parser to read as
//! it comes, up to a size and a deadline.

use std::{
    fmt,
    fs::{File, FileType},
    io::{self, Read},
    os::{
        fd::AsRawFd,
        unix::fs::{FileTypeExt, OpenOptionsExt},
    },
    path::Path,
    time::{Duration, Instant},
};

/// Why a bounded read did not give the whole file.
#[derive(Debug)]
pub enum ReadError {
    /// It could not be opened or read.
    Io(io::Error),
    /// It is not a regular file (nor, for a [`Stream`], a FIFO): what it is.
    NotRegular(&'static str),
    /// It holds more than this many bytes.
    TooLarge(u64),
    /// It was still being read when the patience ran out, with this many
    /// bytes read; a stream that gave nothing was never written to.
    Late {
        read: u64,
        patience: Duration,
        stream: bool,
    },
}

impl fmt::Display for ReadError {
    /// The rest of a sentence that starts with the file's name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "cannot be read: {e}"),
            Self::NotRegular(what) => write!(f, "is {what}, not a regular file"),
            Self::TooLarge(max) => write!(f, "is larger than {}", size(*max)),
            Self::Late {
                read: 0,
                patience,
                stream: true,
            } => write!(
                f,
                "is not a regular file and nothing was written to it within {} s",
                patience.as_secs()
            ),
            Self::Late { read, patience, .. } => write!(
                f,
                "was still being read after {} s ({} read)",
                patience.as_secs(),
                size(*read)
            ),
        }
    }
}

impl std::error::Error for ReadError {}

/// A byte count as people read it.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// What a file type is, for a message: "a FIFO", "a directory"…
pub fn kind_of(file_type: FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_file() {
        "a regular file"
    } else {
        "not a file"
    }
}

/// Opens without blocking, and says what was opened.
fn open(path: &Path) -> Result<(File, FileType), ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(ReadError::Io)?;
    let file_type = file.metadata().map_err(ReadError::Io)?.file_type();
    Ok((file, file_type))
}

/// A regular file, opened without blocking, for a reader whose bound is
/// the file's own size; anything else is named.
pub fn open_regular(path: &Path) -> Result<File, ReadError> {
    let (file, file_type) = open(path)?;
    if !file_type.is_file() {
        return Err(ReadError::NotRegular(kind_of(file_type)));
    }
    Ok(file)
}

/// A regular file's bytes, if it holds at most `max` of them.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(max));
    }
    Ok(bytes)
}

/// A regular file's text (UTF-8), if it holds at most `max` bytes.
pub fn read_regular_text(path: &Path, max: u64) -> Result<String, ReadError> {
    let bytes = read_regular(path, max)?;
    String::from_utf8(bytes)
        .map_err(|e| ReadError::Io(io::Error::new(io::ErrorKind::InvalidData, e)))
}

/// A regular file or a FIFO, read as it comes: at most `max` bytes, and
/// from a FIFO nothing after `patience` has passed since the open. When a read fails
/// for the bound, [`Stream::overrun`] says which.
pub struct Stream {
    file: File,
    fifo: bool,
    max: u64,
    read: u64,
    patience: Duration,
    deadline: Instant,
    overrun: Option<ReadError>,
}

impl Stream {
    pub fn open(path: &Path, max: u64, patience: Duration) -> Result<Self, ReadError> {
        let (file, file_type) = open(path)?;
        if !file_type.is_file() && !file_type.is_fifo() {
            return Err(ReadError::NotRegular(kind_of(file_type)));
        }
        Ok(Self {
            file,
            fifo: file_type.is_fifo(),
            max,
            read: 0,
            patience,
            deadline: Instant::now() + patience,
            overrun: None,
        })
    }

    /// Why reading stopped, when a bound stopped it.
    pub fn overrun(&mut self) -> Option<ReadError> {
        self.overrun.take()
    }

    fn exceeded(&mut self, why: ReadError) -> io::Error {
        let e = io::Error::other(why.to_string());
        self.overrun = Some(why);
        e
    }

    fn late(&mut self) -> io::Error {
        self.exceeded(ReadError::Late {
            read: self.read,
            patience: self.patience,
            stream: self.fifo,
        })
    }

    /// Waits until the file can be read, at most until the deadline. A
    /// regular file always can: its size bound is its time bound (a large
    /// inventory on a slow machine is read whole, not cut at the deadline).
    fn ready(&mut self) -> io::Result<()> {
        if !self.fifo {
            return Ok(());
        }
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.late());
            }
            let mut poll = libc::pollfd {
                fd: self.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one pollfd on the stack, for a descriptor we own.
            match unsafe { libc::poll(&mut poll, 1, ms) } {
                n if n > 0 => return Ok(()),
                0 => continue,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read > self.max {
            return Err(self.exceeded(ReadError::TooLarge(self.max)));
        }
        // One byte past the bound tells a file of exactly `max` bytes
        // from a larger one.
        let room = (self.max + 1 - self.read).min(buf.len() as u64) as usize;
        loop {
            self.ready()?;
            match self.file.read(&mut buf[..room]) {
                Ok(n) => {
                    self.read += n as u64;
                    if self.read > self.max {
                        return Err(self.exceeded(ReadError::TooLarge(self.max)));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Scratch files and FIFOs for the tests of every reader.
#[cfg(test)]
pub mod testing {
    use std::{path::PathBuf, process::Command};

    /// A fresh path of this test process's own.
    pub fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("podtrace-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        path
    }

    /// A FIFO at a fresh path.
    pub fn fifo(name: &str) -> PathBuf {
        let path = scratch(name);
        mkfifo(&path);
        path
    }

    pub fn mkfifo(path: &std::path::Path) {
        assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
    }

    /// A /dev/zero of a node's own at `path` (a link to /dev/zero would
    /// be the node's, resolved inside its root). Needs CAP_MKNOD.
    pub fn mkzero(path: &std::path::Path) {
        let made = Command::new("mknod")
            .arg(path)
            .args(["c", "1", "5"])
            .status();
        assert!(
            made.is_ok_and(|s| s.success()),
            "mknod {} c 1 5 failed: this test needs CAP_MKNOD (root)",
            path.display()
        );
    }

    /// A thread that opens the FIFO at `path` for writing (which waits
    /// for a reader) and hands it to `write`.
    pub fn writer(
        path: &std::path::Path,
        write: impl FnOnce(std::fs::File) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            write(std::fs::OpenOptions::new().write(true).open(path).unwrap());
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::{testing::*, *};

    #[test]
    fn a_regular_file_is_read_up_to_its_bound() {
        let path = scratch("small");
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_regular(&path, 10).unwrap(), b"0123456789");
        let err = read_regular(&path, 9).unwrap_err();
        assert_eq!(err.to_string(), "is larger than 9 bytes");
    }

    #[test]
    fn a_fifo_is_named_at_once_not_waited_for() {
        let path = fifo("fifo");
        let started = Instant::now();
        let err = read_regular(&path, 1 << 20).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(err.to_string(), "is a FIFO, not a regular file");
    }

    #[test]
    fn dev_zero_is_named_and_not_read() {
        let err = read_regular(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(err.to_string(), "is a character device, not a regular file");
        let err = Stream::open(Path::new("/dev/zero"), 1 << 20, Duration::from_secs(5))
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "is a character device, not a regular file");
    }

    #[test]
    fn a_symlink_loop_says_why_it_cannot_be_read() {
        let path = scratch("loop");
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(&path, &path).unwrap();
        let err = read_regular(&path, 10).unwrap_err().to_string();
        assert!(err.starts_with("cannot be read: "), "{err}");
        assert!(err.contains("symbolic links"), "{err}");
    }

    #[test]
    fn a_fifo_nobody_writes_to_ends_at_its_deadline() {
        let path = fifo("silent");
        let started = Instant::now();
        let mut stream = Stream::open(&path, 1 << 20, Duration::from_millis(300)).unwrap();
        let mut text = String::new();
        assert!(stream.read_to_string(&mut text).is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(
            stream.overrun().unwrap().to_string(),
            "is not a regular file and nothing was written to it within 0 s"
        );
    }

    #[test]
    fn a_fifo_is_read_as_it_comes_and_capped() {
        let path = fifo("stream");
        let mut stream = Stream::open(&path, 4 << 10, Duration::from_secs(10)).unwrap();
        // More than the bound, then the writer stays until read.
        let writer = writer(&path, |mut w| {
            let _ = w.write_all(&[b'x'; 8 << 10]);
        });
        let mut bytes = Vec::new();
        assert!(stream.read_to_end(&mut bytes).is_err());
        assert_eq!(
            stream.overrun().unwrap().to_string(),
            "is larger than 4 KiB"
        );
        drop(stream);
        writer.join().unwrap();
    }

    #[test]
    fn a_fifo_that_ends_is_read_whole() {
        let path = fifo("whole");
        let mut stream = Stream::open(&path, 1 << 20, Duration::from_secs(10)).unwrap();
        let writer = writer(&path, |mut w| w.write_all(b"{\"items\":[]}").unwrap());
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        assert_eq!(text, "{\"items\":[]}");
        writer.join().unwrap();
    }
}
