//! Tests that need an RDMA device (feature `rdma`).
//!
//! They use the first device, or the one named by `SCAD_RDMA_DEVICE`, on port
//! `SCAD_RDMA_PORT` (default 1) and GID index `SCAD_RDMA_GID_INDEX` (default: the first
//! RoCE v2 entry on Ethernet ports, else 0). Without a device, or with the port down,
//! each test prints why it was skipped and returns. Soft-RoCE is enough to run them:
//! `rdma link add rxe0 type rxe netdev eth0`.
//!
//! `cargo test -p scad-core --features rdma --test rdma_hw -- --nocapture --test-threads 1`
//!
//! Without the feature, the one test here checks that `rdma_uverbs` durls say they need it.

#[cfg(not(feature = "rdma"))]
#[test]
fn uverbs_needs_the_rdma_feature() {
    let config = "mem;rdma_uverbs;url,tcp://127.0.0.1:9;"
        .parse::<scad_core::Durl>()
        .unwrap()
        .resolve()
        .unwrap();
    let err = scad_core::transport::open("mem", &config).unwrap_err();
    assert!(
        matches!(&err, scad_core::Error::Unsupported(m) if m.contains("`rdma` feature")),
        "{err:?}"
    );
}

#[cfg(feature = "rdma")]
mod hw {
    use std::sync::Arc;
    use std::time::Duration;

    use scad_core::rdma::{
        list_devices, LinkLayer, RdmaOptions, RdmaServer, RdmaServerConfig, RdmaTransport,
    };
    use scad_core::{Error, ReadOp, RegisteredBuffer, Transport, WriteOp};

    /// The device, port and GID index to test with, or `None` (after saying why).
    #[derive(Debug, Clone)]
    struct Hw {
        device: String,
        port: u8,
        gid_index: u8,
    }

    fn hw() -> Option<Hw> {
        let devices = list_devices().expect("listing devices never fails for lack of them");
        if devices.is_empty() {
            println!("skipped: no RDMA device (set SCAD_RDMA_DEVICE to choose one)");
            return None;
        }
        let wanted = std::env::var("SCAD_RDMA_DEVICE").ok();
        let dev = match &wanted {
            Some(name) => devices.iter().find(|d| &d.name == name).unwrap_or_else(|| {
                let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
                panic!("SCAD_RDMA_DEVICE={name} is not among the devices present: {names:?}")
            }),
            None => &devices[0],
        };
        let port: u8 = std::env::var("SCAD_RDMA_PORT").ok().map_or(1, |p| {
            p.parse().expect("SCAD_RDMA_PORT must be a port number")
        });
        let Some(p) = dev.ports.iter().find(|p| p.port == port) else {
            println!("skipped: device {} has no port {port}", dev.name);
            return None;
        };
        if !p.active {
            println!(
                "skipped: port {port} of {} is {}, not active",
                dev.name, p.state
            );
            return None;
        }
        let gid_index = match std::env::var("SCAD_RDMA_GID_INDEX") {
            Ok(g) => g.parse().expect("SCAD_RDMA_GID_INDEX must be a number"),
            Err(_) if p.link_layer == LinkLayer::Ethernet => p
                .gids
                .iter()
                .find(|g| g.kind.as_deref() == Some("RoCE v2"))
                .or_else(|| p.gids.first())
                .map_or(0, |g| g.index as u8),
            Err(_) => 0,
        };
        Some(Hw {
            device: dev.name.clone(),
            port,
            gid_index,
        })
    }

    fn server(hw: &Hw, size: u64, token: Option<&str>) -> RdmaServer {
        RdmaServer::start(
            "127.0.0.1:0",
            size,
            RdmaServerConfig {
                token: token.map(str::to_owned),
                device: Some(hw.device.clone()),
                port: hw.port,
                gid_index: hw.gid_index,
                ..RdmaServerConfig::default()
            },
        )
        .expect("start the RDMA memory server")
    }

    fn options(hw: &Hw, token: Option<&str>) -> RdmaOptions {
        RdmaOptions {
            token: token.map(str::to_owned),
            device: Some(hw.device.clone()),
            port: hw.port,
            gid_index: hw.gid_index,
            timeout: Duration::from_secs(10),
            ..RdmaOptions::default()
        }
    }

    #[test]
    fn devices_have_ports_and_gids() {
        let Some(hw) = hw() else { return };
        let devices = list_devices().unwrap();
        for d in &devices {
            println!("{d}");
            assert!(!d.ports.is_empty() || d.error.is_some(), "{d}");
        }
        let dev = devices.iter().find(|d| d.name == hw.device).unwrap();
        let port = dev.ports.iter().find(|p| p.port == hw.port).unwrap();
        assert!(port.active_mtu >= 256, "{dev}");
        if port.link_layer == LinkLayer::Ethernet {
            assert!(!port.gids.is_empty(), "a RoCE port needs a GID: {dev}");
        }
    }

    #[test]
    fn plain_reads_and_writes_round_trip_and_reach_the_server() {
        let Some(hw) = hw() else { return };
        let srv = server(&hw, 1 << 20, Some("s3cret"));
        let opts = RdmaOptions {
            bounce_size: 64 * 1024,
            queue_depth: 4,
            ..options(&hw, Some("s3cret"))
        };
        let client = RdmaTransport::connect(&srv.local_addr().to_string(), opts).unwrap();
        assert_eq!(client.remote_size().unwrap(), 1 << 20);

        client.write(4096, b"remote memory").unwrap();
        let mut back = [0u8; 13];
        client.read(4096, &mut back).unwrap();
        assert_eq!(&back, b"remote memory");
        let mut seen = [0u8; 13];
        srv.region().read(4096, &mut seen).unwrap();
        assert_eq!(
            &seen, b"remote memory",
            "the server's region holds the write"
        );

        // Larger than the bounce buffer and longer than the queue depth: many batches.
        let big: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect();
        client.write(100_000, &big).unwrap();
        let mut got = vec![0u8; big.len()];
        client.read(100_000, &mut got).unwrap();
        assert!(got == big, "large round trip differs");

        // Vectored: a chain of reads, only the last signalled.
        let (mut a, mut b, mut c) = ([0u8; 5], [0u8; 3], vec![0u8; 70_000]);
        client
            .write_vectored(&[
                WriteOp {
                    addr: 10,
                    src: b"hello",
                },
                WriteOp {
                    addr: 900_000,
                    src: b"abc",
                },
            ])
            .unwrap();
        client
            .read_vectored(&mut [
                ReadOp {
                    addr: 10,
                    dst: &mut a,
                },
                ReadOp {
                    addr: 900_000,
                    dst: &mut b,
                },
                ReadOp {
                    addr: 100_000,
                    dst: &mut c,
                },
            ])
            .unwrap();
        assert_eq!((&a, &b), (b"hello", b"abc"));
        assert!(c == big[..70_000]);

        let stats = client.stats();
        assert!(
            stats.bytes_read >= 700_000 && stats.bytes_written >= 700_000,
            "{stats}"
        );
    }

    #[test]
    fn registered_buffers_move_data_without_a_copy() {
        let Some(hw) = hw() else { return };
        let srv = server(&hw, 1 << 20, None);
        let client =
            RdmaTransport::connect(&srv.local_addr().to_string(), options(&hw, None)).unwrap();
        let buf = RegisteredBuffer::new(256 * 1024).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        buf.write_at(1000, &data).unwrap();
        client
            .write_from_buffer(&buf, 1000, data.len(), 8192)
            .unwrap();
        let buf2 = RegisteredBuffer::new(256 * 1024).unwrap();
        client.read_to_buffer(&buf2, 5, data.len(), 8192).unwrap();
        let mut back = vec![0u8; data.len()];
        buf2.read_at(5, &mut back).unwrap();
        assert!(back == data);
        // Reusing the buffers hits the registration cache; dropping one and allocating
        // another (maybe at the same address) registers afresh.
        drop(buf2);
        let buf3 = RegisteredBuffer::new(256 * 1024).unwrap();
        client.read_to_buffer(&buf3, 0, 16, 8192).unwrap();
        let mut head = [0u8; 16];
        buf3.read_at(0, &mut head).unwrap();
        assert_eq!(&head[..], &data[..16]);
    }

    #[test]
    fn out_of_range_is_refused_locally_and_the_transport_stays_usable() {
        let Some(hw) = hw() else { return };
        let srv = server(&hw, 4096, None);
        let client =
            RdmaTransport::connect(&srv.local_addr().to_string(), options(&hw, None)).unwrap();
        let err = client.write(4000, &[0u8; 200]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::OutOfRange {
                    addr: 4000,
                    len: 200,
                    size: 4096,
                    ..
                }
            ),
            "{err:?}"
        );
        let buf = RegisteredBuffer::new(64).unwrap();
        assert!(client
            .read_to_buffer(&buf, 0, 64, u64::MAX - 10)
            .unwrap_err()
            .is_out_of_range());
        assert!(matches!(
            client.read_to_buffer(&buf, 60, 10, 0),
            Err(Error::BufferRange { .. })
        ));
        client.write(4090, b"edge!!").unwrap();
        let mut back = [0u8; 6];
        client.read(4090, &mut back).unwrap();
        assert_eq!(&back, b"edge!!");
    }

    #[test]
    fn wrong_token_is_refused() {
        let Some(hw) = hw() else { return };
        let srv = server(&hw, 4096, Some("right"));
        let addr = srv.local_addr().to_string();
        for token in [Some("wrong"), None] {
            let err = RdmaTransport::connect(&addr, options(&hw, token)).unwrap_err();
            assert!(matches!(err, Error::Auth { .. }), "{err:?}");
        }
        // The server counts a refusal after sending it: give its threads a moment.
        let start = std::time::Instant::now();
        while srv.stats().refused < 2 && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(srv.stats().refused, 2);
        assert_eq!(srv.stats().connections, 0);
    }

    #[test]
    fn many_threads_use_their_own_queue_pairs() {
        let Some(hw) = hw() else { return };
        let srv = server(&hw, 1 << 20, None);
        let client = Arc::new(
            RdmaTransport::connect(&srv.local_addr().to_string(), options(&hw, None)).unwrap(),
        );
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let client = Arc::clone(&client);
                std::thread::spawn(move || {
                    let base = u64::from(t) * 65536;
                    for i in 0..200u32 {
                        let data = [t ^ (i as u8); 512];
                        let addr = base + u64::from(i % 100) * 512;
                        client.write(addr, &data).unwrap();
                        let mut back = [0u8; 512];
                        client.read(addr, &mut back).unwrap();
                        assert_eq!(back, data);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(srv.active_connections() >= 1);
    }

    #[test]
    fn durl_opens_the_transport_and_server_shutdown_fails_calls_cleanly() {
        let Some(hw) = hw() else { return };
        let srv = server(&hw, 8192, None);
        let durl = format!(
            "mem;rdma_uverbs;url,{};device,{};port,{};gid_index,{};timeout_ms,5000;",
            srv.url(),
            hw.device,
            hw.port,
            hw.gid_index
        );
        let config = durl.parse::<scad_core::Durl>().unwrap().resolve().unwrap();
        let t = scad_core::transport::open("mem", &config).unwrap();
        t.write(0, b"x").unwrap();
        assert!(t.describe().starts_with("rdma://"));
        srv.shutdown();
        // The server destroyed its queue pairs: the next call fails (retry exceeded or a
        // reconnect refused), it does not hang or corrupt anything.
        let mut b = [0u8; 1];
        let start = std::time::Instant::now();
        assert!(t.read(0, &mut b).is_err());
        assert!(start.elapsed() < Duration::from_secs(30));
    }
}
