//! Storing frames: round trips of every supported type over tcp and local memory
//! elements, projections, batches, metadata validation, Arrow interop.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, env, fact, Backend};
use polars::prelude::*;
use scad_remote_frame::{Error, FrameMeta, RemoteFrame};

#[test]
fn round_trip_all_types_tcp_and_local() {
    for backend in [Backend::Tcp, Backend::Local] {
        let e = env(backend, 16 << 20);
        let env = e.env.with_chunk_rows(100);
        let df = fact(1, 1000, 50);
        let frame = RemoteFrame::from_polars(&env, &df).unwrap();
        assert_eq!(frame.rows(), 1000);
        assert_eq!(frame.chunk_count(), 10);
        assert_eq!(&frame.schema().unwrap(), df.schema().as_ref());
        let back = frame.to_polars().unwrap();
        assert!(back.equals_missing(&df), "{backend:?}: round trip differs");
        // Chunks went to both memory elements.
        let elements: std::collections::BTreeSet<_> = frame
            .meta()
            .chunks
            .iter()
            .map(|c| c.element.clone())
            .collect();
        assert_eq!(elements.len(), 2, "{backend:?}");
        let stats = env.stats();
        assert!(stats.bytes_out > 0 && stats.bytes_in > 0, "{stats:?}");
    }
}

#[test]
fn empty_one_row_and_all_null_frames() {
    let e = env(Backend::Local, 4 << 20);
    let df = fact(2, 1, 5);
    let one = RemoteFrame::from_polars(&e.env, &df).unwrap();
    assert!(one.to_polars().unwrap().equals_missing(&df));
    let empty = df.clear();
    let f = RemoteFrame::from_polars(&e.env, &empty).unwrap();
    assert_eq!(f.rows(), 0);
    assert_eq!(f.chunk_count(), 0);
    let back = f.to_polars().unwrap();
    assert_eq!(back.schema(), empty.schema());
    assert_eq!(back.height(), 0);
    let nulls = df!(
        "a" => [None::<i64>, None, None],
        "s" => [None::<&str>, None, None],
    )
    .unwrap()
    .lazy()
    .with_columns([lit(NULL).alias("n")])
    .collect()
    .unwrap();
    let f = RemoteFrame::from_polars(&e.env, &nulls).unwrap();
    assert!(f.to_polars().unwrap().equals_missing(&nulls));
}

#[test]
fn projection_reads_only_its_columns_and_batches_cover_all_rows() {
    let e = env(Backend::Tcp, 16 << 20);
    let env = e.env.with_chunk_rows(64);
    let df = fact(3, 1000, 50);
    let frame = RemoteFrame::from_polars(&env, &df).unwrap();
    env.reset_stats();
    let sub = frame.select_columns(&["qty", "name"]).unwrap();
    assert!(sub.equals_missing(&df.select(["qty", "name"]).unwrap()));
    let moved = env.stats().bytes_in;
    let idx = frame.column_indices(&["qty", "name"]).unwrap();
    assert_eq!(
        moved,
        frame.meta().column_bytes(&idx),
        "only the projected buffers move"
    );
    assert!(moved < frame.data_bytes() / 2);

    let mut rows = 0;
    let mut parts = Vec::new();
    for b in frame.batches(Some(&["k1", "price"]), 3000).unwrap() {
        let b = b.unwrap();
        rows += b.height();
        parts.push(b);
    }
    assert!(parts.len() > 2, "several batches");
    assert_eq!(rows, 1000);
    let mut all = parts[0].clone();
    for p in &parts[1..] {
        all.vstack_mut(p).unwrap();
    }
    assert!(all.equals_missing(&df.select(["k1", "price"]).unwrap()));

    let err = frame.select_columns(&["nope"]).unwrap_err();
    assert!(matches!(err, Error::UnknownColumn { .. }), "{err}");
    assert!(
        err.to_string().contains("nope") && err.to_string().contains("qty"),
        "{err}"
    );
}

#[test]
fn metadata_round_trips_and_bad_metadata_is_refused() {
    let e = env(Backend::Local, 4 << 20);
    let env = e.env.with_chunk_rows(50);
    let df = fact(4, 120, 10);
    let frame = RemoteFrame::from_polars(&env, &df).unwrap();
    let json = frame.to_json().unwrap();
    let again = RemoteFrame::from_json(&env, &json).unwrap();
    assert!(again.to_polars().unwrap().equals_missing(&df));

    let meta: FrameMeta = serde_json::from_str(&json).unwrap();
    let expect_meta = |m: FrameMeta, needle: &str| {
        let err = RemoteFrame::open(&env, m).unwrap_err();
        assert!(matches!(err, Error::Meta(_)), "{err}");
        assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
    };
    let mut m = meta.clone();
    m.rows += 1;
    expect_meta(m, "rows");
    let mut m = meta.clone();
    m.chunks[1].columns[2].buffers.last_mut().unwrap().len += 8;
    expect_meta(m, "qty");
    let mut m = meta.clone();
    m.chunks[0].columns.pop();
    expect_meta(m, "columns");
    let mut m = meta.clone();
    m.chunks[0].element = "mem9".into();
    expect_meta(m, "mem9");
    let mut m = meta.clone();
    m.version = 99;
    expect_meta(m, "version");
    let mut m = meta.clone();
    m.chunks[0].columns[0].buffers[0].offset = m.chunks[0].bytes;
    expect_meta(m, "outside");

    assert!(matches!(
        RemoteFrame::from_json(&env, "{\"version\": 1"),
        Err(Error::MetaJson(_))
    ));
    assert!(matches!(
        RemoteFrame::from_json(&env, &json.replace("\"int64\"", "\"int65\"")),
        Err(Error::MetaJson(_))
    ));
    // A type swapped for one of another width is caught by the buffer sizes.
    let err =
        RemoteFrame::from_json(&env, &json.replacen("\"int64\"", "\"int32\"", 1)).unwrap_err();
    assert!(matches!(err, Error::Meta(_)), "{err}");
}

#[test]
fn corrupted_string_views_give_an_error_not_garbage() {
    let e = env(Backend::Local, 4 << 20);
    let df =
        df!("s" => ["a string longer than twelve bytes", "another one of those here"]).unwrap();
    let frame = RemoteFrame::from_polars(&e.env, &df).unwrap();
    let c = &frame.meta().chunks[0];
    let views = c.columns[0].buffers[0];
    // Point the first view's buffer index far away.
    let t = e.env.elements().transport(&c.element).unwrap();
    t.write(c.addr + views.offset + 8, &77u32.to_le_bytes())
        .unwrap();
    let err = frame.to_polars().unwrap_err();
    assert!(matches!(err, Error::Arrow(_) | Error::Meta(_)), "{err}");
    assert!(err.to_string().contains("buffer index"), "{err}");
}

#[test]
fn writer_refuses_mismatched_batches() {
    let e = env(Backend::Local, 4 << 20);
    let mut w = scad_remote_frame::FrameWriter::new(&e.env);
    w.push(&df!("a" => [1i64], "b" => ["x"]).unwrap()).unwrap();
    let err = w
        .push(&df!("a" => [1i32], "b" => ["x"]).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, Error::TypeMismatch { column, .. } if column == "a"),
        "{err}"
    );
    let err = w
        .push(&df!("a" => [1i64], "c" => ["x"]).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownColumn { name, .. } if name == "c"),
        "{err}"
    );
    let err = RemoteFrame::from_polars(
        &e.env,
        &df!("t" => [1i64])
            .unwrap()
            .lazy()
            .select([col("t").implode(true)])
            .collect()
            .unwrap(),
    );
    assert!(matches!(err, Err(Error::UnsupportedType { .. })), "{err:?}");
}

#[test]
fn record_batches_round_trip() {
    let e = env(Backend::Local, 8 << 20);
    let env = e.env.with_chunk_rows(128);
    let df = fact(5, 300, 20);
    let frame = RemoteFrame::from_polars(&env, &df).unwrap();
    let batches = frame.to_record_batches().unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 300);
    assert_eq!(
        batches[0].schema().field(4).data_type(),
        &arrow_schema::DataType::Date32
    );
    assert!(matches!(
        batches[0].schema().field(6).data_type(),
        arrow_schema::DataType::Decimal128(12, 2)
    ));
    let again = RemoteFrame::from_record_batches(&env, &batches).unwrap();
    assert_same(&again.to_polars().unwrap(), &df, "arrow round trip");
    assert!(RemoteFrame::from_record_batches(&env, &[]).is_err());
}

#[test]
fn chunks_keep_the_min_and_max_of_each_column() {
    let e = env(Backend::Local, 4 << 20);
    let env = e.env.with_chunk_rows(50);
    let mut df = fact(5, 120, 10);
    // A chunk of NaN and a column of nulls only: no statistics for those.
    let mut price: Vec<Option<f64>> = df.column("price").unwrap().f64().unwrap().iter().collect();
    price[3] = Some(f64::NAN);
    df.with_column(Column::new("price".into(), price)).unwrap();
    df.with_column(Column::full_null("nothing".into(), 120, &DataType::Null))
        .unwrap();
    let frame = RemoteFrame::from_polars(&env, &df).unwrap();
    let meta = frame.meta();
    let mut offset = 0;
    for chunk in &meta.chunks {
        let part = df.slice(offset, chunk.rows as usize);
        offset += chunk.rows as i64;
        let stats = |name: &str| {
            chunk.columns[meta.column_index(name).unwrap()]
                .stats
                .clone()
        };
        let qty = part.column("qty").unwrap().as_materialized_series();
        let s = stats("qty").expect("qty has statistics");
        assert_eq!(s.min, serde_json::json!(qty.min::<i64>().unwrap().unwrap()));
        assert_eq!(s.max, serde_json::json!(qty.max::<i64>().unwrap().unwrap()));
        let day = part.column("day").unwrap().cast(&DataType::Int32).unwrap();
        let s = stats("day").expect("day has statistics");
        let day = day.as_materialized_series();
        assert_eq!(s.min, serde_json::json!(day.min::<i32>().unwrap().unwrap()));
        assert_eq!(s.max, serde_json::json!(day.max::<i32>().unwrap().unwrap()));
        let names = part.column("name").unwrap().str().unwrap().clone();
        let s = stats("name").expect("short names have statistics");
        assert_eq!(
            s.min,
            serde_json::json!(names.iter().flatten().min().unwrap())
        );
        assert_eq!(
            s.max,
            serde_json::json!(names.iter().flatten().max().unwrap())
        );
        let has_nan = part.column("price").unwrap().f64().unwrap().is_nan().any();
        assert_eq!(stats("price").is_none(), has_nan, "price statistics");
        assert!(
            stats("nothing").is_none(),
            "a null column has no statistics"
        );
    }
    // Metadata written before statistics were kept predates seals (version 1, refused
    // by its version); statistics stripped from sealed metadata no longer match the
    // seal, which covers them (wrong bounds would skip chunks a query needs).
    let mut old: serde_json::Value = serde_json::from_str(&frame.to_json().unwrap()).unwrap();
    for chunk in old["chunks"].as_array_mut().unwrap() {
        for column in chunk["columns"].as_array_mut().unwrap() {
            column.as_object_mut().unwrap().remove("stats");
        }
    }
    let err = RemoteFrame::from_json(&env, &old.to_string()).unwrap_err();
    assert!(
        matches!(&err, Error::Stale { reason, .. } if reason.contains("other metadata")),
        "{err}"
    );
    // (NaN is not equal to itself: compare without it.)
    let without_nan = |d: DataFrame| d.drop("price").unwrap();
    assert!(without_nan(frame.to_polars().unwrap()).equals_missing(&without_nan(df)));
}

#[test]
fn float_bounds_read_back_exactly() {
    let e = env(Backend::Local, 4 << 20);
    let env = e.env.with_chunk_rows(7);
    // Doubles whose shortest decimal form the default JSON parser reads back one
    // ulp off (a bound one ulp below the maximum would skip the chunk holding it).
    let x: Vec<f64> = (1..200)
        .map(|i| 1.0 / f64::from(i) + f64::from(i) * 1e-17 + 0.1)
        .collect();
    let df = df!("x" => &x).unwrap();
    let frame = RemoteFrame::from_polars(&env, &df).unwrap();
    let json = frame.to_json().unwrap();
    let back = FrameMeta::from_json(&json).unwrap();
    assert_eq!(&back, frame.meta());
    assert_eq!(back.to_json().unwrap(), frame.meta().to_json().unwrap());
    for (chunk, rows) in back.chunks.iter().zip(x.chunks(7)) {
        let Some(stats) = &chunk.columns[0].stats else {
            panic!("no bounds for a float chunk");
        };
        let max = rows.iter().copied().fold(f64::MIN, f64::max);
        assert_eq!(stats.max.as_f64().map(f64::to_bits), Some(max.to_bits()));
    }
}
