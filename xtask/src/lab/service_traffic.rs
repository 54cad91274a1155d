//! The traffic of the lab's Services: a listener in every backend pod
//! (and on the outside), and the one-shot clients the tests and benches
//! send requests through.

use std::{fs, net::IpAddr, process::Stdio};

use anyhow::{Context, Result};

use super::{
    in_netns,
    kube_proxy::{TCP_PORT, UDP_PORT},
    Lab, LabPod,
};

impl Lab {
    /// A TCP listener and a UDP echo in every backend pod (python3),
    /// recorded so that `down` stops them.
    pub(super) fn start_listeners(&self) -> Result<()> {
        use std::os::unix::process::CommandExt;
        const SERVER: &str = r#"
import os, socket, sys, threading
tcp_port, udp_port = int(sys.argv[1]), int(sys.argv[2])
def bound(kind):
    # Both families where the pod has IPv6 (a dual-stack lab), else IPv4.
    try:
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = "::"
    except OSError:
        s = socket.socket(socket.AF_INET, kind)
        address = "0.0.0.0"
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, udp_port if kind == socket.SOCK_DGRAM else tcp_port))
    return s
def udp():
    u = bound(socket.SOCK_DGRAM)
    while True:
        data, peer = u.recvfrom(2048)
        u.sendto(data, peer)
threading.Thread(target=udp, daemon=True).start()
t = bound(socket.SOCK_STREAM)
t.listen(64)
while True:
    c, _ = t.accept()
    try:
        c.recv(4096)
        c.sendall(b"ok\n")
    except OSError:
        pass
    c.close()
"#;
        let mut pids = String::new();
        let mut backends: Vec<LabPod> = self
            .services()
            .into_iter()
            .flat_map(|s| s.backends)
            .collect();
        backends.sort_by(|a, b| a.name.cmp(&b.name));
        backends.dedup_by(|a, b| a.name == b.name);
        // The outside's listener too.
        let netns = backends
            .into_iter()
            .map(|pod| pod.netns)
            .chain([self.underlay_netns()]);
        for netns in netns {
            let child = in_netns(&netns, "python3")
                .args(["-c", SERVER, &TCP_PORT.to_string(), &UDP_PORT.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .context("cannot start a backend listener (python3)")?;
            pids.push_str(&format!("{}\n", child.id()));
        }
        fs::create_dir_all(self.state_dir())?;
        fs::write(self.state_dir().join("listeners.pids"), pids)?;
        // Until they listen.
        for _ in 0..50 {
            let db = self.pod("db-1");
            let up = in_netns(&db.netns, "ss")
                .args(["-Hltn", &format!("sport = :{TCP_PORT}")])
                .output()
                .is_ok_and(|o| !o.stdout.is_empty());
            if up {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(())
    }

    /// Stops the listeners `install_services` started.
    pub(super) fn stop_listeners(&self) {
        let Ok(pids) = fs::read_to_string(self.state_dir().join("listeners.pids")) else {
            return;
        };
        for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            // SAFETY: a pid this lab started and recorded.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// One TCP request from inside a pod to `ip:port`: the answer, if any
    /// (`Err` says what the client saw: refused, timed out).
    pub fn tcp_request(
        &self,
        from_pod: &str,
        ip: impl Into<IpAddr>,
        port: u16,
    ) -> Result<String, String> {
        client(&self.pod(from_pod).netns, "tcp", ip.into(), port, 2)
    }

    /// One TCP request that waits 5 s for its answer (a slow server).
    pub fn tcp_request_patient(
        &self,
        from_pod: &str,
        ip: impl Into<IpAddr>,
        port: u16,
    ) -> Result<String, String> {
        client(&self.pod(from_pod).netns, "tcp", ip.into(), port, 5)
    }

    /// One TCP request from any of the lab's namespaces (a client outside
    /// the pods: the underlay, a node).
    pub fn tcp_request_from_netns(
        &self,
        netns: &str,
        ip: impl Into<IpAddr>,
        port: u16,
    ) -> Result<String, String> {
        client(netns, "tcp", ip.into(), port, 2)
    }

    /// One UDP datagram from inside a pod, and its echo.
    pub fn udp_request(
        &self,
        from_pod: &str,
        ip: impl Into<IpAddr>,
        port: u16,
    ) -> Result<String, String> {
        client(&self.pod(from_pod).netns, "udp", ip.into(), port, 2)
    }
}

/// One request (`tcp` or `udp`) from inside `netns` to `ip:port`, that
/// waits `timeout_s` for its answer.
fn client(
    netns: &str,
    proto: &str,
    ip: IpAddr,
    port: u16,
    timeout_s: u32,
) -> Result<String, String> {
    const CLIENT: &str = r#"
import socket, sys
proto, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
family = socket.AF_INET6 if ":" in ip else socket.AF_INET
s = socket.socket(family, kind)
s.settimeout(float(sys.argv[4]))
try:
    s.connect((ip, port))
    s.send(b"hello\n")
    print(s.recv(64).decode().strip())
except OSError as e:
    print(type(e).__name__, e)
    sys.exit(1)
"#;
    let out = in_netns(netns, "python3")
        .args([
            "-c",
            CLIENT,
            proto,
            &ip.to_string(),
            &port.to_string(),
            &timeout_s.to_string(),
        ])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}
