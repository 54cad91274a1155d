//! BIRD's own word on its BGP sessions, asked through its control socket
//! as `birdc` (and `calicoctl node status`) ask it: the greeting
//! `0001 BIRD … ready.`, then `show status` (the router id) and
//! `show protocols all` (every protocol, with the BGP sessions' state,
//! neighbour and last error).
//!
//! BIRD's reply protocol, one line at a time: `NNNN-text` is a line of
//! reply code NNNN with more to come, `NNNN text` the reply's last line,
//! and ` text` (a leading space) one more line of the code before it.
//! 0000 is OK; codes 8xxx and 9xxx are errors.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::Duration,
};

use crate::node::host_root::HostRoot;
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

/// Where the control socket is, under a node's root: calico-node's, then
/// a packaged BIRD's.
pub const SOCKETS: &[&str] = &[
    "var/run/calico/bird.ctl",
    "var/run/bird/bird.ctl",
    "run/bird/bird.ctl",
];
/// calico-node's second BIRD, for an IPv6 pool (its own config and
/// sessions, between the nodes' IPv6 addresses).
pub const SOCKETS6: &[&str] = &["var/run/calico/bird6.ctl"];
/// A BIRD that does not answer within this is as good as not there.
const TIME_BOUND: Duration = Duration::from_secs(2);
/// A reply past this is not BIRD's (ours has a few kB per protocol).
const REPLY_MAX: usize = 4 << 20;

/// A protocol's name line (`show protocols`).
const PROTOCOL_LIST: u16 = 1002;
/// A protocol's details (`show protocols all`).
const PROTOCOL_DETAILS: u16 = 1006;
/// `show status`: `Router ID is …`.
const ROUTER_ID: u16 = 1011;

/// One BGP protocol as BIRD tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// `Mesh_192_0_2_12` (Calico's name for a mesh peer).
    pub name: String,
    pub neighbor: Option<IpAddr>,
    /// The BGP state: Established, Active, Connect, Passive, Idle, Down…
    pub state: String,
    /// The info column (`Socket: Connection closed`, after the state).
    pub info: String,
    /// `Last error:` of its details.
    pub last_error: Option<String>,
}

impl Session {
    pub fn established(&self) -> bool {
        self.state == "Established"
    }

    /// What BIRD says went wrong: the last error, else the info column.
    pub fn why(&self) -> Option<&str> {
        self.last_error
            .as_deref()
            .or((!self.info.is_empty()).then_some(self.info.as_str()))
    }
}

/// What BIRD answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bird {
    /// The socket, as the node names it (`/var/run/calico/bird.ctl`).
    pub socket: String,
    pub router_id: Option<Ipv4Addr>,
    pub sessions: Vec<Session>,
}

/// Asking BIRD: its answer, no socket at all, or a socket that did not
/// answer (and why).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    Answered(Bird),
    NoSocket,
    Silent { socket: String, why: String },
}

/// Asks the BIRD whose socket is under `root`, each step time-bound.
pub async fn ask(root: &HostRoot) -> Asked {
    ask_at(root, SOCKETS).await
}

/// Asks calico-node's bird6, where it runs (a dual-stack node).
pub async fn ask6(root: &HostRoot) -> Asked {
    ask_at(root, SOCKETS6).await
}

/// Asks the BIRD of the first of `sockets` under `root` that exists.
async fn ask_at(root: &HostRoot, sockets: &[&str]) -> Asked {
    let found = (sockets.iter()).find_map(|s| Some((s, root.path(s).ok().filter(|p| p.exists())?)));
    let Some((relative, path)) = found else {
        return Asked::NoSocket;
    };
    let socket = format!("/{relative}");
    match tokio::time::timeout(TIME_BOUND * 2, converse(&path)).await {
        Ok(Ok((router_id, sessions))) => Asked::Answered(Bird {
            socket,
            router_id,
            sessions,
        }),
        Ok(Err(why)) => Asked::Silent { socket, why },
        Err(_) => Asked::Silent {
            socket,
            why: format!("no answer within {} s", (TIME_BOUND * 2).as_secs()),
        },
    }
}

type Lines = Vec<(u16, String)>;

/// The greeting, then `show status` and `show protocols all`.
async fn converse(path: &Path) -> Result<(Option<Ipv4Addr>, Vec<Session>), String> {
    let stream = tokio::time::timeout(TIME_BOUND, UnixStream::connect(path))
        .await
        .map_err(|_| format!("connect took over {} s", TIME_BOUND.as_secs()))?
        .map_err(|e| format!("connect: {e}"))?;
    let mut stream = BufReader::new(stream);
    let greeting = reply(&mut stream).await?;
    if greeting.first().is_none_or(|(code, _)| *code != 1) {
        return Err(format!("not BIRD's greeting: {greeting:?}"));
    }
    let status = command(&mut stream, "show status").await?;
    let protocols = command(&mut stream, "show protocols all").await?;
    Ok((router_id(&status), sessions(&protocols)))
}

/// Sends one command, and reads its reply.
async fn command(stream: &mut BufReader<UnixStream>, command: &str) -> Result<Lines, String> {
    let line = format!("{command}\n");
    tokio::time::timeout(TIME_BOUND, stream.get_mut().write_all(line.as_bytes()))
        .await
        .map_err(|_| format!("{command}: not taken within {} s", TIME_BOUND.as_secs()))?
        .map_err(|e| format!("{command}: {e}"))?;
    reply(stream).await
}

/// One whole reply, each line with its code (continuations take the
/// code before them); an error reply is its text.
async fn reply<R: AsyncBufRead + Unpin>(read: &mut R) -> Result<Lines, String> {
    let mut text = String::new();
    loop {
        let before = text.len();
        let n = tokio::time::timeout(TIME_BOUND, read.read_line(&mut text))
            .await
            .map_err(|_| format!("no reply within {} s", TIME_BOUND.as_secs()))?
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("BIRD closed the connection".into());
        }
        if text.len() > REPLY_MAX {
            return Err(format!("a reply of over {REPLY_MAX} bytes"));
        }
        if is_last(&text[before..]) {
            return parse_reply(&text);
        }
    }
}

/// `NNNN text`: the reply's last line.
fn is_last(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() >= 4
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && matches!(bytes.get(4), None | Some(b' ' | b'\n' | b'\r'))
}

/// A reply's lines with their codes; `Err` for an error reply (8xxx,
/// 9xxx) or a line that is not BIRD's.
pub fn parse_reply(text: &str) -> Result<Lines, String> {
    let mut lines: Lines = Vec::new();
    for line in text.lines() {
        if let Some(more) = line.strip_prefix(' ') {
            let code = lines
                .last()
                .map(|(c, _)| *c)
                .ok_or("a reply that starts with a continuation")?;
            lines.push((code, more.to_string()));
            continue;
        }
        let code: u16 = line
            .get(..4)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("not a line of BIRD's reply: {line:?}"))?;
        let rest = line.get(5..).unwrap_or_default();
        if code >= 8000 {
            return Err(format!("BIRD answers {code} {rest}"));
        }
        lines.push((code, rest.to_string()));
    }
    Ok(lines)
}

/// `Router ID is 192.0.2.11` of `show status`.
pub fn router_id(lines: &[(u16, String)]) -> Option<Ipv4Addr> {
    lines
        .iter()
        .filter(|(code, _)| *code == ROUTER_ID)
        .find_map(|(_, text)| {
            text.trim()
                .strip_prefix("Router ID is ")?
                .trim()
                .parse()
                .ok()
        })
}

/// The BGP protocols of `show protocols all`: a 1002 line names one
/// (`name proto table state since info`), the 1006 lines after it are
/// its details (`BGP state:`, `Neighbor address:`, `Last error:`).
pub fn sessions(lines: &[(u16, String)]) -> Vec<Session> {
    let mut sessions = Vec::new();
    let mut current: Option<Session> = None;
    for (code, text) in lines {
        match *code {
            PROTOCOL_LIST => {
                sessions.extend(current.take());
                current = bgp_protocol(text);
            }
            PROTOCOL_DETAILS => {
                if let Some(session) = &mut current {
                    detail(session, text);
                }
            }
            _ => {}
        }
    }
    sessions.extend(current);
    sessions
}

/// A BGP protocol's list line, its state from the info column until its
/// details say better.
fn bgp_protocol(line: &str) -> Option<Session> {
    let mut words = line.split_whitespace();
    let name = words.next()?;
    if words.next()? != "BGP" {
        return None;
    }
    let _table = words.next()?;
    let _up_or_down = words.next()?;
    let mut rest: Vec<&str> = words.collect();
    // Since: a time, or a date and a time (`timeformat protocol iso long`).
    let since = rest.iter().take(2).filter(|w| looks_like_time(w)).count();
    rest.drain(..since.min(rest.len()));
    let state = rest.first().copied().unwrap_or_default().to_string();
    Some(Session {
        name: name.to_string(),
        neighbor: None,
        info: rest.get(1..).unwrap_or_default().join(" "),
        state,
        last_error: None,
    })
}

/// `02:06:14.402`, `2024-05-01`: a word of the since column.
fn looks_like_time(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_digit())
        && word
            .chars()
            .all(|c| c.is_ascii_digit() || ":.-".contains(c))
}

/// One line of a protocol's details.
fn detail(session: &mut Session, line: &str) {
    let Some((key, value)) = line.trim().split_once(':') else {
        return;
    };
    let value = value.trim();
    match key {
        "BGP state" => session.state = value.to_string(),
        // `fe80::1%eth0` for a link-local peer is left unread.
        "Neighbor address" => session.neighbor = value.parse().ok(),
        "Last error" => session.last_error = Some(value.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bird2 2.0.12's reply on a healthy lab node (recorded).
    const ESTABLISHED: &str = include_str!("bird/established.txt");
    /// Peers down three ways: Active on a socket error, Idle after a
    /// notification, Connect; `timeformat protocol iso long`.
    const DOWN: &str = include_str!("bird/down.txt");
    const STATUS: &str = include_str!("bird/status.txt");

    fn session(
        name: &str,
        neighbor: &str,
        state: &str,
        info: &str,
        error: Option<&str>,
    ) -> Session {
        Session {
            name: name.into(),
            neighbor: Some(neighbor.parse().unwrap()),
            state: state.into(),
            info: info.into(),
            last_error: error.map(String::from),
        }
    }

    #[test]
    fn an_established_mesh_peer_is_read_from_the_protocol_list() {
        let lines = parse_reply(ESTABLISHED).unwrap();
        assert_eq!(lines.last().unwrap().0, 0);
        assert_eq!(
            sessions(&lines),
            [session(
                "Mesh_192_0_2_12",
                "192.0.2.12",
                "Established",
                "",
                None
            )]
        );
        assert!(sessions(&lines)[0].established());
    }

    #[test]
    fn peers_that_are_down_say_their_state_and_last_error() {
        let found = sessions(&parse_reply(DOWN).unwrap());
        let bind = "Socket error: bind: Cannot assign requested address";
        assert_eq!(
            found,
            [
                session("Mesh_10_0_0_2", "10.0.0.2", "Active", bind, Some(bind)),
                session(
                    "Mesh_10_0_0_3",
                    "10.0.0.3",
                    "Idle",
                    "Received: Bad peer AS",
                    Some("Received: Bad peer AS")
                ),
                session("Mesh_10_0_0_4", "10.0.0.4", "Connect", "", None),
            ]
        );
        assert_eq!(found[0].why(), Some(bind));
        assert_eq!(found[2].why(), None);
        assert!(!found.iter().any(Session::established));
    }

    #[test]
    fn the_router_id_comes_from_show_status() {
        let lines = parse_reply(STATUS).unwrap();
        assert_eq!(router_id(&lines), Some("192.0.2.99".parse().unwrap()));
        assert_eq!(
            lines.last().unwrap(),
            &(13, "Daemon is up and running".to_string())
        );
    }

    #[test]
    fn an_error_reply_or_a_stranger_is_an_error() {
        assert_eq!(
            parse_reply("9001 syntax error, unexpected CF_SYM_UNDEFINED\n"),
            Err("BIRD answers 9001 syntax error, unexpected CF_SYM_UNDEFINED".into())
        );
        assert_eq!(
            parse_reply("8003 No protocols match\n"),
            Err("BIRD answers 8003 No protocols match".into())
        );
        assert!(parse_reply("HTTP/1.1 400 Bad Request\n").is_err());
        assert!(parse_reply(" continued\n").is_err());
        assert!(is_last("0000 \n") && is_last("0013 Daemon is up and running\n"));
        assert!(!is_last("1002-Mesh_1 BGP\n") && !is_last(" Neighbor AS: 1\n"));
    }

    /// A real conversation with a stand-in BIRD on a unix socket: the
    /// greeting, both commands, as birdc sends them.
    #[tokio::test]
    async fn ask_talks_birds_protocol_over_the_socket() {
        // A node whose /var/run is Debian's absolute link to /run: the
        // socket is found in the node's /run, not this machine's.
        let dir = std::env::temp_dir().join(format!("podtrace-bird-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("var")).unwrap();
        std::os::unix::fs::symlink("/run", dir.join("var/run")).unwrap();
        let root = HostRoot::new(&dir);
        let dir = dir.join("run/calico");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bird.ctl");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut stream = BufReader::new(stream);
            stream
                .get_mut()
                .write_all(b"0001 BIRD 2.0.12 ready.\n")
                .await
                .unwrap();
            let mut asked = Vec::new();
            for answer in [STATUS, DOWN] {
                let mut line = String::new();
                stream.read_line(&mut line).await.unwrap();
                asked.push(line);
                stream.get_mut().write_all(answer.as_bytes()).await.unwrap();
            }
            asked
        });
        let Asked::Answered(bird) = ask(&root).await else {
            panic!("no answer")
        };
        assert_eq!(
            server.await.unwrap(),
            ["show status\n", "show protocols all\n"]
        );
        assert_eq!(bird.socket, "/var/run/calico/bird.ctl");
        assert_eq!(bird.router_id, Some("192.0.2.99".parse().unwrap()));
        assert_eq!(bird.sessions.len(), 3);
        // A socket nobody listens on any more: said, with the error.
        let Asked::Silent { why, .. } = ask(&root).await else {
            panic!("an answer from a closed socket")
        };
        assert!(why.contains("Connection refused"), "{why}");
        let _ = std::fs::remove_dir_all(root.dir());
        assert_eq!(ask(&root).await, Asked::NoSocket);
    }
}
