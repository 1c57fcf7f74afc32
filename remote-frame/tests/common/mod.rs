//! Test fixtures: frame environments over embedded tcp memory servers or local
//! transports, random tables, and order-insensitive comparison.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use polars::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{LocalTransport, TcpOptions, TcpTransport};
use scad_core::Transport;
use scad_remote_array::MemoryElements;
use scad_remote_frame::FrameEnv;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    Tcp,
}

pub struct Env {
    pub env: FrameEnv,
    pub servers: Vec<MemoryServer>,
}

pub fn env(backend: Backend, element_bytes: u64) -> Env {
    let elements = Arc::new(MemoryElements::with_alignment(64));
    let mut servers = Vec::new();
    for i in 0..2 {
        let t: Arc<dyn Transport> = match backend {
            Backend::Local => Arc::new(LocalTransport::new(element_bytes).unwrap()),
            Backend::Tcp => {
                let s = MemoryServer::start("127.0.0.1:0", element_bytes, ServerConfig::default())
                    .unwrap();
                let t = TcpTransport::connect(
                    &s.local_addr().to_string(),
                    TcpOptions {
                        timeout: Duration::from_secs(5),
                        connect_timeout: Duration::from_secs(5),
                        ..TcpOptions::default()
                    },
                )
                .unwrap();
                servers.push(s);
                Arc::new(t)
            }
        };
        elements.add(&format!("mem{i}"), t).unwrap();
    }
    Env {
        env: FrameEnv::new(elements),
        servers,
    }
}

/// `Some(value)`, or `None` with probability `null_pct`%.
macro_rules! opt {
    ($rng:expr, $null_pct:expr, $v:expr $(,)?) => {{
        let v = $v;
        if $rng.gen_range(0..100) < $null_pct {
            None
        } else {
            Some(v)
        }
    }};
}

/// A "fact" table: keys with duplicates and nulls, several payload types.
pub fn fact(seed: u64, rows: usize, key_range: i64) -> DataFrame {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut k1 = Vec::new();
    let mut k2 = Vec::new();
    let mut qty = Vec::new();
    let mut price = Vec::new();
    let mut day = Vec::new();
    let mut name = Vec::new();
    let mut cents = Vec::new();
    let mut flag = Vec::new();
    for i in 0..rows {
        let k = rng.gen_range(0..key_range);
        k1.push(opt!(rng, 5, k));
        k2.push(opt!(rng, 5, format!("s{}", k % 7)));
        qty.push(opt!(rng, 10, rng.gen_range(-50i64..500)));
        price.push(opt!(rng, 10, (rng.gen_range(0..100_000) as f64) / 100.0));
        day.push(opt!(rng, 10, 10_000 + rng.gen_range(0..800)));
        name.push(opt!(
            rng,
            10,
            if i % 3 == 0 {
                format!("a long enough name number {}", rng.gen_range(0..50))
            } else {
                format!("n{}", rng.gen_range(0..50))
            },
        ));
        cents.push(opt!(rng, 10, rng.gen_range(0i64..1_000_000)));
        flag.push(opt!(rng, 10, rng.gen_bool(0.5)));
    }
    let df = df!(
        "k1" => k1,
        "k2" => k2,
        "qty" => qty,
        "price" => price,
        "day" => day,
        "name" => name,
        "cents" => cents,
        "flag" => flag,
    )
    .unwrap();
    df.lazy()
        .with_columns([
            col("day").cast(DataType::Date),
            col("cents").cast(DataType::Decimal(12, 2)),
        ])
        .collect()
        .unwrap()
}

/// A "dimension" table keyed like [`fact`].
pub fn dim(seed: u64, rows: usize, key_range: i64) -> DataFrame {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut k1 = Vec::new();
    let mut k2 = Vec::new();
    let mut w = Vec::new();
    let mut label = Vec::new();
    for _ in 0..rows {
        let k = rng.gen_range(0..key_range);
        k1.push(opt!(rng, 5, k));
        k2.push(opt!(rng, 5, format!("s{}", k % 7)));
        w.push(opt!(rng, 10, rng.gen_range(0i64..1000)));
        label.push(opt!(rng, 10, format!("label-{}", rng.gen_range(0..100))));
    }
    df!("d1" => k1, "d2" => k2, "w" => w, "label" => label).unwrap()
}

/// Sorted by every column (non-float columns first), so results compare regardless
/// of row order.
pub fn normalize(df: &DataFrame) -> DataFrame {
    let schema = df.schema();
    let mut names: Vec<PlSmallStr> = schema
        .iter()
        .filter(|(_, t)| !t.is_float())
        .map(|(n, _)| n.clone())
        .collect();
    names.extend(
        schema
            .iter()
            .filter(|(_, t)| t.is_float())
            .map(|(n, _)| n.clone()),
    );
    df.clone()
        .lazy()
        .sort(
            names,
            SortMultipleOptions::default().with_maintain_order(true),
        )
        .collect()
        .unwrap()
}

/// Same schema and rows in any order; floats equal to 1e-9 relative (summation order
/// differs between partitioned and one-shot aggregation).
pub fn assert_same(got: &DataFrame, want: &DataFrame, what: &str) {
    assert_eq!(got.schema(), want.schema(), "{what}: schema");
    assert_eq!(got.height(), want.height(), "{what}: rows");
    let (g, w) = (normalize(got), normalize(want));
    for (gc, wc) in g.columns().iter().zip(w.columns()) {
        if gc.dtype().is_float() {
            let gv = gc.cast(&DataType::Float64).unwrap();
            let wv = wc.cast(&DataType::Float64).unwrap();
            for (a, b) in gv.f64().unwrap().iter().zip(wv.f64().unwrap().iter()) {
                match (a, b) {
                    (Some(a), Some(b)) => assert!(
                        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
                        "{what}: column {} differs: {a} vs {b}",
                        gc.name()
                    ),
                    (a, b) => {
                        assert_eq!(a.is_none(), b.is_none(), "{what}: nulls of {}", gc.name())
                    }
                }
            }
        } else {
            assert!(
                gc.as_materialized_series()
                    .equals_missing(wc.as_materialized_series()),
                "{what}: column {} differs\n got {g}\nwant {w}",
                gc.name()
            );
        }
    }
}

/// Free bytes over all of `env`'s memory elements.
pub fn available(env: &FrameEnv) -> u64 {
    env.elements()
        .allocation_state()
        .allocators
        .iter()
        .map(|a| a.available())
        .sum()
}
