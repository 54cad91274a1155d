//! Bad input on the command line: each case is said (podtrace's own errors
//! in one line, clap's usage errors whole), with a non-zero exit, and
//! nothing attached.

// The helpers are shared with the other kernel tests.
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use support::*;
use xtask::lab::Topology;

#[test]
fn garbage_arguments_say_what_is_wrong_with_them() {
    let lab = lab(Topology::FlannelVxlan);
    let pods = lab.0.pods_file().display().to_string();
    let node1 = lab.0.node_netns(1);
    let web0 = lab.0.pod("web-0").netns;
    let with_lab = |src: &'static str, dst: &'static str| {
        vec![
            src,
            dst,
            "--netns",
            Box::leak(node1.clone().into_boxed_str()),
        ]
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            with_lab("foo bar", "10.244.2.2"),
            "\"foo bar\" is not a pod or an IP address",
        ),
        (
            with_lab("10.244.1.300", "10.244.2.2"),
            "10.244.1.300 is not an IPv4 address",
        ),
        (
            with_lab("10.244.1.2/24", "10.244.2.2"),
            "10.244.1.2/24 is a network",
        ),
        (with_lab("", "10.244.2.2"), "an empty pod argument"),
        (
            with_lab("10.244.1.2:5000", "10.244.2.2"),
            "10.244.1.2:5000: a port on SRC is not used (a client's socket picks its own); to trace one port's traffic, give --port 5000",
        ),
        (
            with_lab("10.244.1.2", "fd00::2"),
            "10.244.1.2 is an IPv4 address and fd00::2 an IPv6 one: a packet has both ends in one family",
        ),
        (
            with_lab("10.244.1.2", "Web_0"),
            "\"Web_0\" is not a pod name",
        ),
        (
            vec![
                "10.244.1.2",
                "10.244.2.2",
                "--duration",
                "99999999999999999999h",
            ],
            "not a duration",
        ),
        (vec!["10.244.1.2", "10.244.2.2", "--count", "0"], "--count"),
        // clap's usage errors say all they know: the missing argument,
        // the values an option takes.
        (vec!["10.244.1.2"], "<DST>"),
        (
            vec!["10.244.1.2", "10.244.2.2", "-o", "xml"],
            "[possible values: human, json]",
        ),
        (
            vec![
                "web-0",
                "db-0",
                "--pods-file",
                &pods,
                "--netns",
                &node1,
                "--netns",
                &node1,
            ],
            "are the same network namespace",
        ),
        // A pod's own namespace is no node: its hooks see none of the path.
        (
            vec![
                "web-0",
                "db-0",
                "--pods-file",
                &pods,
                "--netns",
                &web0,
            ],
            "is default/web-0's own network namespace (it holds",
        ),
        // Profile mode keeps no packet: a trace's flags are refused, not
        // ignored.
        (
            vec!["profile", "web-0", "db-0", "--count", "3"],
            "--count is a trace's flag",
        ),
        (
            vec!["profile", "web-0", "db-0", "-w", "/tmp/never.pcapng"],
            "--write is a trace's flag",
        ),
        (
            vec!["profile", "web-0", "db-0", "--sample", "10"],
            "--sample is a trace's flag",
        ),
        (
            vec!["profile", "web-0", "db-0", "--host-root", "/"],
            "--host-root is a trace's flag",
        ),
    ];
    for (argv, expected) in cases {
        assert_refused(&argv, expected, &node1);
    }
}

#[test]
fn a_huge_pods_file_with_a_missing_pod_suggests_a_few_names() {
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    // About 50 MB of pods named like the missing one.
    let items: Vec<String> = (0..200_000)
        .map(|i| {
            format!(
                r#"{{"metadata":{{"name":"web-{i}","namespace":"default","labels":{{"app":"web","pad":"{}"}}}},"spec":{{"nodeName":"node-1"}},"status":{{"podIP":"10.9.{}.{}","phase":"Running"}}}}"#,
                "x".repeat(160),
                i / 250 % 250,
                i % 250
            )
        })
        .collect();
    let file = std::env::temp_dir().join(format!("podtrace-huge-{}.json", std::process::id()));
    std::fs::write(&file, format!(r#"{{"items":[{}]}}"#, items.join(","))).unwrap();
    let path = file.display().to_string();
    let done = run_podtrace(&["web-x", "web-1", "--pods-file", &path, "--netns", &node1]);
    let _ = std::fs::remove_file(&file);
    assert!(!done.status.success());
    assert_eq!(
        done.stderr.lines().count(),
        1,
        "{}",
        &done.stderr[..done.stderr.len().min(500)]
    );
    assert!(
        done.stderr.len() < 300,
        "a short line: {} bytes",
        done.stderr.len()
    );
    assert!(
        done.stderr
            .contains("pod default/web-x not found; did you mean"),
        "{}",
        done.stderr
    );
    assert!(tcx_programs(&node1).is_empty());
}

#[test]
fn a_fifo_with_no_writer_as_pods_file_fails_instead_of_hanging() {
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    let fifo = std::env::temp_dir().join(format!("podtrace-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo");
    let path = fifo.display().to_string();
    let started = Instant::now();
    let done = run_podtrace(&["web-0", "db-0", "--pods-file", &path, "--netns", &node1]);
    let _ = std::fs::remove_file(&fifo);
    assert!(started.elapsed() < Duration::from_secs(30), "it hung");
    assert!(!done.status.success());
    assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    assert!(
        done.stderr
            .contains("is not a regular file and nothing was written to it"),
        "{}",
        done.stderr
    );
    assert!(tcx_programs(&node1).is_empty());
}

/// `podtrace … 2>&1 | head`: once the reader is gone, every line podtrace
/// says on stderr fails to be written. It must go on tracing, tell its
/// story on stdout and detach at the end, never panic (it did: exit 101).
#[test]
fn a_closed_stderr_does_not_stop_a_trace() {
    let lab = lab(Topology::FlannelVxlan);
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let child = std::process::Command::new(PODTRACE)
        .args(one_packet(&lab.0, "web-0", "db-0", "json"))
        .stdout(std::process::Stdio::piped())
        .stderr(writer)
        .spawn()
        .expect("podtrace runs");
    // No banner to read: attached on both nodes is the sign of a start.
    let deadline = Instant::now() + Duration::from_secs(30);
    let attached = |node| !tcx_programs(&lab.0.node_netns(node)).is_empty();
    while !(attached(1) && attached(2)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut child = child;
    // A ping each second until its story ends the run (--count 1).
    while child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
        ping(&lab.0, "web-0", "db-0");
        std::thread::sleep(Duration::from_secs(1));
    }
    let out = child.wait_with_output().expect("podtrace ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("\"type\":\"story\""), "{stdout}");
    for node in [1, 2] {
        assert!(tcx_programs(&lab.0.node_netns(node)).is_empty());
    }
}
