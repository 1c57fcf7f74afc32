//! `Action`: named transports, late configuration, waiting, registered buffers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::{Action, Error, TransportConfig, TransportState};

#[test]
fn late_configuration_wakes_a_waiting_reader() {
    let server = MemoryServer::start("127.0.0.1:0", 1 << 20, ServerConfig::default()).unwrap();
    let action = Arc::new(Action::new("late"));
    assert_eq!(
        action.add_transport("mem;rdma_tcp;").unwrap(),
        TransportState::Pending
    );
    let mem = action.endpoint("mem").unwrap();
    mem.reg(4096).unwrap();
    mem.buffer().unwrap().write_at(0, b"ping").unwrap();
    let writer = std::thread::spawn(move || {
        mem.write(4, 64, 0)?;
        mem.read(4, 64, 8)?;
        let mut four = [0u8; 4];
        mem.buffer()?.read_at(8, &mut four)?;
        Ok::<_, Error>(four)
    });
    std::thread::sleep(Duration::from_millis(50));
    let state = action
        .config_transport("mem", &format!("mem;rdma_tcp;url,{};", server.url()))
        .unwrap();
    assert_eq!(state, TransportState::Ready);
    assert_eq!(&writer.join().unwrap().unwrap(), b"ping");
    assert_eq!(server.stats().bytes_written, 4);
}

/// The original's `runtime_example_tcp.py` / `runtime_example_local.py`: a transport
/// added as `client1;IMPL;`, used at once by the element (its calls wait), and completed
/// from another thread with bare `KEY,VALUE;` pairs.
fn partial_durl_completed_from_another_thread(kind: &str, pairs: String) {
    let action = Arc::new(Action::new("0000"));
    assert_eq!(
        action.add_transport(&format!("client1;{kind};")).unwrap(),
        TransportState::Pending
    );
    let configurer = {
        let action = Arc::clone(&action);
        std::thread::spawn(move || {
            // Give the element time to block in its first call (the original waits 5 s).
            std::thread::sleep(Duration::from_millis(50));
            action.config_transport("client1", &pairs)
        })
    };
    let trans = action.endpoint("client1").unwrap();
    let buf = trans.reg(4096).unwrap();
    buf.write_at(0, &12345u32.to_ne_bytes()).unwrap();
    trans.write(4, 0, 0).unwrap(); // waits for the configuration
    trans.read(4, 0, 4).unwrap();
    let mut fetched = [0u8; 4];
    buf.read_at(4, &mut fetched).unwrap();
    assert_eq!(u32::from_ne_bytes(fetched), 12345);
    assert_eq!(configurer.join().unwrap().unwrap(), TransportState::Ready);
    assert_eq!(action.state("client1").unwrap(), TransportState::Ready);
}

#[test]
fn bare_pairs_complete_a_tcp_transport_while_a_write_waits() {
    let server = MemoryServer::start("127.0.0.1:0", 65536, ServerConfig::default()).unwrap();
    let port = server.local_addr().port();
    partial_durl_completed_from_another_thread("rdma_tcp", format!("url,tcp://localhost:{port};"));
    assert_eq!(server.stats().bytes_written, 4);
}

#[test]
fn bare_pairs_complete_a_local_transport_while_a_write_waits() {
    partial_durl_completed_from_another_thread("rdma_local", "size,65536;".into());
}

#[test]
fn malformed_pairs_leave_the_transport_pending_and_name_the_bad_part() {
    let action = Action::new("bad");
    action.add_transport("client1;rdma_tcp;").unwrap();
    for (pairs, part) in [
        ("url,tcp://localhost:2333", "url,tcp://localhost:2333"),
        ("size,65536;", "size,65536"),
        ("url;", "url"),
    ] {
        match action.config_transport("client1", pairs) {
            Err(Error::Durl { part: p, .. }) => assert_eq!(p, part, "{pairs:?}"),
            other => panic!("{pairs:?}: {other:?}"),
        }
        assert_eq!(action.state("client1").unwrap(), TransportState::Pending);
    }
    let err = action
        .config_transport("client1", "size,65536;")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("size,65536") && err.contains("rdma_tcp"),
        "{err}"
    );
    assert!(matches!(
        action.config_transport("nope", "url,tcp://h:1;"),
        Err(Error::UnknownTransport { .. })
    ));
}

#[test]
fn unconfigured_transport_times_out_with_a_clear_error() {
    let action = Action::with_timeout("t", Duration::from_millis(100));
    action.add_transport("mem;rdma_tcp;").unwrap();
    let mem = action.endpoint("mem").unwrap();
    mem.reg(16).unwrap();
    let started = Instant::now();
    let err = mem.read(4, 0, 0).unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(100));
    match err {
        Error::Timeout { what, .. } => {
            assert!(what.contains("\"mem\"") && what.contains("url"), "{what}")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn terminate_wakes_waiters() {
    let action = Arc::new(Action::new("term"));
    action.add_transport("mem;rdma_local;").unwrap();
    let mem = action.endpoint("mem").unwrap();
    let waiter = std::thread::spawn(move || mem.read_into(0, &mut [0u8; 4]));
    std::thread::sleep(Duration::from_millis(30));
    action.terminate();
    assert!(matches!(
        waiter.join().unwrap(),
        Err(Error::Terminated { .. })
    ));
    assert!(action.names().is_empty());
}

#[test]
fn names_kinds_and_buffers_are_checked() {
    let action = Action::new("checks");
    assert!(matches!(
        action.endpoint("nope"),
        Err(Error::UnknownTransport { .. })
    ));
    action.add_transport("a;rdma_local;size,4096;").unwrap();
    action.add_transport("b;rdma_local;size,4096;").unwrap();
    action
        .add_transport("srv;rdma_tcp_server;url,tcp://*:0;size,4096;")
        .unwrap();
    let err = action.endpoint("zzz").unwrap_err().to_string();
    assert!(err.contains("a, b, srv"), "{err}");
    assert!(matches!(
        action.add_transport("a;rdma_local;size,1;"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        action.add_transport("c;rdma_local;size,x;"),
        Err(Error::Durl { .. })
    ));
    assert!(matches!(
        action.config_transport("a", "b;rdma_local;size,4096;"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        action.config_transport("a", "a;rdma_local;size,8192;"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        action.endpoint("srv"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        action.server_config("srv").unwrap(),
        TransportConfig::TcpServer { size: 4096, .. }
    ));
    assert!(matches!(
        action.server_config("a"),
        Err(Error::InvalidArgument(_))
    ));

    let a = action.endpoint("a").unwrap();
    let b = action.endpoint("b").unwrap();
    assert!(matches!(a.read(4, 0, 0), Err(Error::NotRegistered { .. })));
    assert!(matches!(a.reg(0), Err(Error::InvalidArgument(_))));
    a.reg(64).unwrap();
    b.reg_shared(&a).unwrap();
    a.buffer().unwrap().write_at(0, b"shared!").unwrap();
    // Data read into the shared buffer through one transport is written out by the other.
    b.write(7, 10, 0).unwrap();
    let mut back = [0u8; 7];
    b.read_into(10, &mut back).unwrap();
    assert_eq!(&back, b"shared!");
    // Reading a's (untouched, zeroed) memory into the shared buffer is seen through b.
    a.read(7, 10, 0).unwrap();
    b.buffer().unwrap().read_at(0, &mut back).unwrap();
    assert_eq!(back, [0u8; 7]);
    assert!(matches!(a.read(8, 0, 60), Err(Error::BufferRange { .. })));
    assert!(a.read(8, 4090, 0).unwrap_err().is_out_of_range());
    assert_eq!(b.stats().bytes_written, 7);
    action.release("a").unwrap();
    assert!(matches!(a.read(1, 0, 0), Err(Error::Terminated { .. })));
    assert!(matches!(
        action.release("a"),
        Err(Error::UnknownTransport { .. })
    ));
    assert_eq!(TransportState::Ready.code(), 1);
}

#[test]
fn client_names_leave_out_server_transports() {
    let action = Action::new("names");
    action.add_transport("b;rdma_local;size,4096;").unwrap();
    action.add_transport("a;rdma_tcp;").unwrap(); // pending: still a client
    action
        .add_transport("srv;rdma_tcp_server;url,tcp://*:0;size,4096;")
        .unwrap();
    assert_eq!(action.names(), ["a", "b", "srv"]);
    assert_eq!(action.client_names(), ["a", "b"]);
}
