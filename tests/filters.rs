//! `--proto` and `--port`: only the chosen packets of the traced pair are
//! told, the rest are left out in the kernel and counted. On the lab with
//! its Services (listeners on db-0 and db-1: TCP 8080, UDP echo 5353).

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::lab::LabGuard;

/// `podtrace web-0 DST FLAGS… -o json -d 6s` on both nodes while web-0
/// pings db-0, sends it a UDP datagram to `udp_port` and makes a TCP
/// request to `tcp` (address, port).
fn traced(lab: &LabGuard, dst: &str, flags: &[&str], udp_port: u16, tcp: (&str, u16)) -> Finished {
    let mut first = vec!["default/web-0", dst, "-o", "json", "-d", "6s"];
    first.extend_from_slice(flags);
    let mut rest = lab_args(&lab.0, &[1, 2]);
    rest.push("--services-file".into());
    rest.push(lab.0.services_file().display().to_string());
    let trace = Trace::start(&argv(&first, rest));
    let db_0 = lab.0.pod("db-0").ip;
    assert!(ping(&lab.0, "web-0", "db-0"));
    let _ = lab.0.udp_request("web-0", db_0, udp_port);
    let (ip, port) = tcp;
    let answer = lab
        .0
        .tcp_request("web-0", ip.parse::<std::net::IpAddr>().unwrap(), port);
    assert!(answer.is_ok(), "{answer:?}");
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    done
}

/// `traced` with db-0 as the destination and its TCP listener.
fn traced_to_db_0(lab: &LabGuard, flags: &[&str], udp_port: u16) -> Finished {
    let db_0 = lab.0.pod("db-0").ip.to_string();
    traced(lab, "default/db-0", flags, udp_port, (&db_0, 8080))
}

fn protocols(done: &Finished) -> Vec<String> {
    done.stories()
        .iter()
        .map(|s| s["transport"]["proto"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn summary(done: &Finished) -> Value {
    done.json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .expect("a summary")
}

#[test]
fn a_port_filter_tells_only_that_ports_packets_and_counts_the_rest() {
    let lab = services_lab();
    let done = traced_to_db_0(&lab, &["--port", "8080"], 5353);
    let protocols = protocols(&done);
    assert!(
        !protocols.is_empty() && protocols.iter().all(|p| p == "tcp"),
        "only the TCP connection's stories: {protocols:?}\n{}",
        done.stdout
    );
    // The ping's request and reply and the UDP datagram and its echo,
    // each seen on several hooks.
    let left_out = summary(&done)["filtered_in_kernel"].as_u64().unwrap_or(0);
    assert!(left_out >= 4, "{}", done.stdout);
}

#[test]
fn a_protocol_filter_tells_only_that_protocol() {
    let lab = services_lab();
    let done = traced_to_db_0(&lab, &["--proto", "icmp"], 5353);
    let protocols = protocols(&done);
    assert_eq!(protocols, ["icmp", "icmp"], "{}", done.stdout);
    assert!(summary(&done)["filtered_in_kernel"].as_u64() > Some(0));
}

/// An ICMP error is news about the packet it quotes: a port unreachable
/// for the UDP datagram to a closed port passes `--proto udp`.
#[test]
fn an_icmp_error_counts_as_the_packet_it_quotes() {
    let lab = services_lab();
    let done = traced_to_db_0(&lab, &["--proto", "udp"], 5354);
    let protocols = protocols(&done);
    assert_eq!(protocols, ["udp", "icmp"], "{}", done.stdout);
}

/// `--port 80` to a Service keeps the backends' target port too: the
/// connection is followed past the DNAT, not cut at it.
#[test]
fn a_service_port_filter_follows_the_dnat_to_the_target_port() {
    let lab = services_lab();
    let svc = lab.0.service("db").cluster_ip.to_string();
    let done = traced(&lab, "svc/db", &["--port", "80"], 5353, (&svc, 80));
    let stories = done.stories();
    assert!(
        !stories.is_empty() && protocols(&done).iter().all(|p| p == "tcp"),
        "{}",
        done.stdout
    );
    assert!(
        stories
            .iter()
            .all(|s| s["verdict"]["outcome"] == "delivered"),
        "{}",
        done.stdout
    );
}

#[test]
fn a_bad_filter_is_said_and_attaches_nothing() {
    let lab = services_lab();
    let nine_ports: Vec<String> = (1..=9)
        .flat_map(|p| ["--port".into(), p.to_string()])
        .collect();
    let nine_ports: Vec<&str> = nine_ports.iter().map(String::as_str).collect();
    for (flags, says) in [
        (&["--port", "abc"][..], "abc"),
        (&["--port", "0"][..], "--port"),
        (&["--port", "70000"][..], "70000"),
        (&["--proto", "sctp"][..], "sctp"),
        (&nine_ports[..], "at most 8 ports"),
    ] {
        let mut first = vec!["default/web-0", "default/db-0"];
        first.extend_from_slice(flags);
        let out = std::process::Command::new(PODTRACE)
            .args(argv(&first, lab_args(&lab.0, &[1, 2])))
            .output()
            .unwrap();
        said_bad_input(out.status, &String::from_utf8_lossy(&out.stderr), says);
    }
    for node in [1, 2] {
        assert!(tcx_programs(&lab.0.node_netns(node)).is_empty());
    }
}
