//! `scad-soak` end to end: a short run against an embedded server and one against a
//! separate `memory_server` process, both with zero errors and zero mismatches; and
//! its refusal of non-loopback servers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use scad_benches::MemoryServerProcess;

fn soak(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_scad-soak"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn a_short_soak_has_no_errors_or_mismatches() {
    let dir = std::env::temp_dir().join(format!("scad-soak-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jsonl = dir.join("soak.jsonl");
    let md = dir.join("soak.md");
    let (ok, text) = soak(&[
        "--clients",
        "3",
        "--seconds",
        "1",
        "--max-ops",
        "300",
        "--jsonl",
        jsonl.to_str().unwrap(),
        "--md",
        md.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("checksum mismatches 0"), "{text}");
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&jsonl).unwrap().trim()).unwrap();
    assert_eq!(line["mismatches"], 0);
    assert_eq!(line["errors"], 0);
    assert!(line["ops"].as_u64().unwrap() > 0);
    assert!(std::fs::read_to_string(&md)
        .unwrap()
        .contains("| 3 clients |"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_soak_against_a_server_process() {
    let server = MemoryServerProcess::start("16M").unwrap();
    let (ok, text) = soak(&[
        "--clients",
        "2",
        "--seconds",
        "1",
        "--max-ops",
        "200",
        "--server",
        &server.addr,
    ]);
    drop(server);
    assert!(ok, "{text}");
    assert!(text.contains("errors 0, checksum mismatches 0"), "{text}");
}

#[test]
fn remote_and_unbounded_runs_are_refused() {
    let (ok, text) = soak(&["--server", "192.0.2.1:2333", "--seconds", "1"]);
    assert!(!ok);
    assert!(text.contains("not a loopback address"), "{text}");
    let (ok, text) = soak(&["--seconds", "100000"]);
    assert!(!ok);
    assert!(text.contains("--seconds"), "{text}");
    let (ok, _) = soak(&["--clients", "100000", "--seconds", "1"]);
    assert!(!ok);
}
