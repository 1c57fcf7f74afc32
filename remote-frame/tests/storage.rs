//! Storing frames: round trips of every supported type over tcp and local memory
//! elements, projections, batches, metadata validation, Arrow interop.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_same, env, fact, Backend};
use polars::prelude::*;
use scad_remote_frame::{Error, FrameEnv, FrameMeta, Packing, RemoteFrame};

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
        frame.meta().column_stored_bytes(&idx),
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

/// Asserts that opening a frame of `meta` fails with a metadata error naming `needle`.
fn expect_refused(env: &FrameEnv, meta: FrameMeta, needle: &str) {
    let err = RemoteFrame::open(env, meta).unwrap_err();
    assert!(matches!(err, Error::Meta(_)), "{err}");
    assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
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
    let mut m = meta.clone();
    m.rows += 1;
    expect_refused(&env, m, "rows");
    let mut m = meta.clone();
    m.chunks[1].columns[2].buffers.last_mut().unwrap().len += 8;
    expect_refused(&env, m, "qty");
    let mut m = meta.clone();
    m.chunks[0].columns.pop();
    expect_refused(&env, m, "columns");
    let mut m = meta.clone();
    m.chunks[0].element = "mem9".into();
    expect_refused(&env, m, "mem9");
    let mut m = meta.clone();
    m.version = 99;
    expect_refused(&env, m, "version");
    let mut m = meta.clone();
    m.chunks[0].columns[0].buffers[0].offset = m.chunks[0].bytes;
    expect_refused(&env, m, "outside");
    let mut m = meta.clone();
    m.distinct.as_mut().unwrap().pop();
    expect_refused(&env, m, "distinct-count sketches");
    // Metadata written before sketches were kept still opens.
    let mut m = meta.clone();
    m.distinct = None;
    assert_eq!(
        RemoteFrame::open(&env, m)
            .unwrap()
            .meta()
            .distinct_estimate(0),
        None
    );

    // A sketch that is not one is refused by name, not read as another.
    let sketches = serde_json::to_value(&meta.distinct).unwrap();
    let first = sketches[0].as_str().unwrap();
    let err = RemoteFrame::from_json(&env, &json.replacen(first, "!!", 1)).unwrap_err();
    assert!(matches!(err, Error::MetaJson(_)), "{err}");
    assert!(err.to_string().contains("sketch"), "{err}");
    assert!(matches!(
        RemoteFrame::from_json(&env, "{\"version\": 1"),
        Err(Error::MetaJson(_))
    ));
    assert!(matches!(
        RemoteFrame::from_json(&env, &json.replace("\"int64\"", "\"int65\"")),
        Err(Error::MetaJson(_))
    ));
    // A type swapped for one of another width is caught by the buffer sizes (prices
    // are floats: never packed).
    let err =
        RemoteFrame::from_json(&env, &json.replacen("\"float64\"", "\"int32\"", 1)).unwrap_err();
    assert!(matches!(err, Error::Meta(_)), "{err}");
}

#[test]
fn written_frames_count_the_distinct_values_of_each_column() {
    let e = env(Backend::Local, 16 << 20);
    let env = e.env.with_chunk_rows(1000);
    let rows = 30_000;
    let df = df!(
        "key" => (0..rows).collect::<Vec<i64>>(),
        "tier" => (0..rows).map(|i| i % 7).collect::<Vec<i64>>(),
        "brand" => (0..rows).map(|i| format!("brand {}", i % 700)).collect::<Vec<_>>(),
        "maybe" => (0..rows).map(|i| (i % 3 == 0).then_some(i % 50)).collect::<Vec<_>>()
    )
    .unwrap();
    let frame = RemoteFrame::from_polars(&env, &df).unwrap();
    let meta = frame.meta();
    // Over 30 chunks: the sketches cover the whole frame.
    assert_eq!(meta.chunks.len(), 30);
    for (column, distinct) in [("key", 30_000), ("tier", 7), ("brand", 700), ("maybe", 50)] {
        let got = meta
            .distinct_estimate(meta.column_index(column).unwrap())
            .unwrap();
        let error = (got as f64 - distinct as f64).abs() / distinct as f64;
        assert!(error < 0.08, "{column}: estimated {got} of {distinct}");
    }
    // Kept through the metadata.
    let again = RemoteFrame::from_json(&env, &frame.to_json().unwrap()).unwrap();
    assert_eq!(again.meta().distinct, meta.distinct);
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

/// Columns of every packable type whose chunks span ranges that pack into 1, 2, 4
/// and 8 bytes, or not at all; nulls over values far outside those ranges.
fn packable_batch() -> arrow_array::RecordBatch {
    use arrow_array::types::*;
    use arrow_array::{ArrayRef, Decimal128Array, PrimitiveArray};
    use arrow_buffer::NullBuffer;
    use std::sync::Arc;
    const ROWS: usize = 300;
    // Every seventh row null, its slot holding the type's largest value.
    let nulls = NullBuffer::from((0..ROWS).map(|i| i % 7 != 3).collect::<Vec<_>>());
    fn column<T: arrow_array::ArrowPrimitiveType>(
        values: impl Fn(usize) -> T::Native,
        hidden: T::Native,
        nulls: Option<NullBuffer>,
    ) -> PrimitiveArray<T> {
        let v: Vec<T::Native> = (0..ROWS)
            .map(|i| match &nulls {
                Some(n) if n.is_null(i) => hidden,
                _ => values(i),
            })
            .collect();
        PrimitiveArray::<T>::new(v.into(), nulls)
    }
    let n = || Some(nulls.clone());
    let i = |i: usize| i as i64;
    let cols: Vec<(&str, ArrayRef)> = vec![
        // 1000..1250: one byte each.
        (
            "i64_w1",
            Arc::new(column::<Int64Type>(|r| 1000 + i(r) % 250, i64::MAX, n())),
        ),
        // -30000..: two bytes.
        (
            "i64_w2",
            Arc::new(column::<Int64Type>(|r| -30_000 + 200 * i(r), i64::MIN, n())),
        ),
        // Four bytes, no nulls.
        (
            "i64_w4",
            Arc::new(column::<Int64Type>(|r| 1 << 40 | i(r) << 20, 0, None)),
        ),
        // The whole range: as is.
        (
            "i64_wide",
            Arc::new(column::<Int64Type>(
                |r| {
                    if r % 2 == 0 {
                        i64::MIN + i(r)
                    } else {
                        i64::MAX - i(r)
                    }
                },
                0,
                n(),
            )),
        ),
        (
            "i32_w2",
            Arc::new(column::<Int32Type>(|r| -5 - 100 * r as i32, i32::MAX, n())),
        ),
        (
            "date_w2",
            Arc::new(column::<Date32Type>(
                |r| 2_450_000 + r as i32,
                i32::MIN,
                n(),
            )),
        ),
        (
            "i16_w1",
            Arc::new(column::<Int16Type>(
                |r| -100 + (r % 200) as i16,
                i16::MAX,
                n(),
            )),
        ),
        (
            "u64_w2",
            Arc::new(column::<UInt64Type>(|r| (1 << 40) + 200 * r as u64, 0, n())),
        ),
        (
            "u32_w1",
            Arc::new(column::<UInt32Type>(
                |r| 7 + (r % 50) as u32,
                u32::MAX,
                None,
            )),
        ),
        (
            "u16_w1",
            Arc::new(column::<UInt16Type>(|r| 60_000 + (r % 200) as u16, 0, n())),
        ),
        (
            "dec_w4",
            Arc::new(
                column::<Decimal128Type>(|r| 123_456 * r as i128 - 9_999_999, i128::MAX, n())
                    .with_precision_and_scale(12, 2)
                    .unwrap(),
            ),
        ),
        (
            "dec_w8",
            Arc::new(
                column::<Decimal128Type>(|r| (1i128 << 50) * r as i128, i128::MIN, n())
                    .with_precision_and_scale(38, 0)
                    .unwrap(),
            ),
        ),
        (
            "dec_wide",
            Arc::new(Decimal128Array::from(vec![i128::MAX / 2, -(i128::MAX / 2)]).slice(0, 2)),
        ),
    ];
    // All columns ROWS long but the last: repeat it.
    let cols: Vec<(&str, ArrayRef)> = cols
        .into_iter()
        .map(|(name, a)| {
            if a.len() == ROWS {
                (name, a)
            } else {
                let idx = arrow_array::UInt32Array::from(
                    (0..ROWS as u32).map(|r| r % 2).collect::<Vec<_>>(),
                );
                (
                    name,
                    datafusion::arrow::compute::take(a.as_ref(), &idx, None).unwrap(),
                )
            }
        })
        .collect();
    arrow_array::RecordBatch::try_from_iter(cols).unwrap()
}

#[test]
fn small_ranges_are_packed_and_read_back_exactly() {
    for backend in [Backend::Tcp, Backend::Local] {
        let e = env(backend, 8 << 20);
        let env = e.env.with_chunk_rows(300);
        let batch = packable_batch();
        let frame = RemoteFrame::from_record_batches(&env, std::slice::from_ref(&batch)).unwrap();
        let chunk = &frame.meta().chunks[0];
        let widths: Vec<Option<u8>> = chunk
            .columns
            .iter()
            .map(|c| c.packing.map(|p| p.width))
            .collect();
        assert_eq!(
            widths,
            [
                Some(1),
                Some(2),
                Some(4),
                None,
                Some(2),
                Some(2),
                Some(1),
                Some(2),
                Some(1),
                Some(1),
                Some(4),
                Some(8),
                None
            ],
            "{backend:?}"
        );
        // The smallest valid value is the base: nulls' slots do not count.
        let first = chunk.columns[0].packing.unwrap();
        assert_eq!(first.base, 1000);
        let local = frame.data_bytes();
        let stored = frame.meta().stored_bytes();
        assert!(stored * 10 < local * 6, "{stored} stored of {local}");
        env.reset_stats();
        let back = frame.to_record_batches().unwrap();
        assert_eq!(env.stats().bytes_in, stored, "reading moves what is stored");
        assert_eq!(back.len(), 1);
        for (k, (got, want)) in back[0].columns().iter().zip(batch.columns()).enumerate() {
            assert_eq!(got.as_ref(), want.as_ref(), "{backend:?}: column {k}");
        }
        // One column alone moves its packed bytes only.
        env.reset_stats();
        let one: Vec<_> = frame
            .record_batches(Some(&["i64_w1"]), u64::MAX)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
            .concat();
        assert_eq!(one[0].column(0).as_ref(), batch.column(0).as_ref());
        assert_eq!(
            env.stats().bytes_in,
            300 + 38,
            "one byte a row, and the validity bitmap"
        );
    }
}

#[test]
fn bad_packing_metadata_is_refused() {
    let e = env(Backend::Local, 8 << 20);
    let env = e.env.with_chunk_rows(300);
    let frame = RemoteFrame::from_record_batches(&env, &[packable_batch()]).unwrap();
    let meta = frame.meta().clone();
    // The metadata with column `col`'s packing in the first chunk edited.
    let repacked = |col: usize, edit: fn(&mut Packing)| {
        let mut m = meta.clone();
        edit(m.chunks[0].columns[col].packing.as_mut().unwrap());
        m
    };
    // A width that is none of 1, 2, 4, 8 (the buffer is 2 bytes a row).
    expect_refused(&env, repacked(1, |p| p.width = 3), "packed in 3 bytes");
    // No narrower than the type: an i64 column packed in 8 bytes.
    expect_refused(&env, repacked(2, |p| p.width = 8), "packed in 8 bytes");
    // The wrong buffer size for the width.
    expect_refused(
        &env,
        repacked(1, |p| p.width = 4),
        "values buffer of 1200 bytes",
    );
    // A base outside the type (i16).
    expect_refused(&env, repacked(6, |p| p.base = 40_000), "base 40000");
    // Unsigned types have no negative base.
    expect_refused(&env, repacked(8, |p| p.base = -1), "base -1");
    // Packing on a column of a type that is never packed, refused when the frame is
    // opened, not when the chunk is read.
    use scad_remote_frame::ColumnType;
    for dtype in [
        ColumnType::Float64,
        ColumnType::String,
        ColumnType::Boolean,
        ColumnType::Null,
    ] {
        let mut m = meta.clone();
        m.schema[1].dtype = dtype;
        expect_refused(&env, m, &format!("a {dtype} column is never packed"));
    }
    // Version 2 frames predate packing.
    let mut m = meta.clone();
    m.version = 2;
    expect_refused(&env, m, "version 2");
}

/// String columns of 600 rows, every fifth null (its slot an empty string): few short
/// strings, few long ones, 301 distinct (2-byte indices), every value distinct, all
/// null.
fn dictionary_batch() -> arrow_array::RecordBatch {
    use arrow_array::{ArrayRef, StringViewArray};
    use std::sync::Arc;
    const ROWS: usize = 600;
    let column = |value: &dyn Fn(usize) -> String| -> ArrayRef {
        Arc::new(
            (0..ROWS)
                .map(|r| (r % 5 != 2).then(|| value(r)))
                .collect::<StringViewArray>(),
        )
    };
    let days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"];
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("short", column(&|r| days[r % 3 + (r / 7) % 2].to_owned())),
        (
            "long",
            column(&|r| format!("a category name of some length no. {}", r % 9)),
        ),
        ("many", column(&|r| format!("k{}", r % 301))),
        ("unique", column(&|r| format!("customer{r:08}"))),
        (
            "none",
            Arc::new(StringViewArray::from(vec![None::<&str>; ROWS])),
        ),
    ];
    arrow_array::RecordBatch::try_from_iter(cols).unwrap()
}

#[test]
fn few_distinct_strings_are_stored_as_dictionaries_and_read_back_exactly() {
    for backend in [Backend::Tcp, Backend::Local] {
        let e = env(backend, 8 << 20);
        let env = e.env.with_chunk_rows(600);
        let batch = dictionary_batch();
        let frame = RemoteFrame::from_record_batches(&env, std::slice::from_ref(&batch)).unwrap();
        let chunk = &frame.meta().chunks[0];
        let dictionaries: Vec<Option<(u32, u8)>> = chunk
            .columns
            .iter()
            .map(|c| c.dictionary.map(|d| (d.entries, d.width)))
            .collect();
        // Four distinct days, nine long names, 301 keys; a column of distinct
        // values (or of nulls only) is kept as views.
        assert_eq!(
            dictionaries,
            [Some((4, 1)), Some((9, 1)), Some((301, 2)), None, None],
            "{backend:?}"
        );
        // The three dictionaries take under a quarter of what their rows take read back.
        let (local, stored) = (
            frame.meta().column_bytes(&[0, 1, 2]),
            frame.meta().column_stored_bytes(&[0, 1, 2]),
        );
        assert!(stored * 4 < local, "{stored} stored of {local}");
        env.reset_stats();
        let back = frame.to_record_batches().unwrap();
        assert_eq!(
            env.stats().bytes_in,
            frame.meta().stored_bytes(),
            "reading moves what is stored"
        );
        for (k, (got, want)) in back[0].columns().iter().zip(batch.columns()).enumerate() {
            assert_eq!(got.as_ref(), want.as_ref(), "{backend:?}: column {k}");
        }
        // The day names alone: a byte a row, the bitmap, four views.
        env.reset_stats();
        let one = frame
            .record_batches(Some(&["short"]), u64::MAX)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
            .concat();
        assert_eq!(one[0].column(0).as_ref(), batch.column(0).as_ref());
        assert_eq!(env.stats().bytes_in, 600 + 75 + 4 * 16);
    }
}

#[test]
fn bad_dictionary_metadata_is_refused() {
    use scad_remote_frame::{ColumnType, Dictionary};
    let e = env(Backend::Local, 8 << 20);
    let env = e.env.with_chunk_rows(600);
    let frame = RemoteFrame::from_record_batches(&env, &[dictionary_batch()]).unwrap();
    let meta = frame.meta().clone();
    let edited = |col: usize, edit: fn(&mut Dictionary)| {
        let mut m = meta.clone();
        edit(m.chunks[0].columns[col].dictionary.as_mut().unwrap());
        m
    };
    expect_refused(&env, edited(0, |d| d.width = 4), "indices of 4 bytes");
    expect_refused(
        &env,
        edited(0, |d| d.entries = 0),
        "a dictionary of 0 strings",
    );
    expect_refused(
        &env,
        edited(2, |d| d.width = 1),
        "a dictionary of 301 strings",
    );
    // The wrong buffer sizes: indices of another width, more entries than views.
    expect_refused(
        &env,
        edited(0, |d| d.width = 2),
        "indices buffer of 1200 bytes",
    );
    expect_refused(
        &env,
        edited(1, |d| d.entries = 10),
        "dictionary views of 160 bytes",
    );
    // A dictionary on a column that is not strings.
    let mut m = meta.clone();
    m.schema[0].dtype = ColumnType::Int64;
    expect_refused(&env, m, "a int64 column is never stored as one");
    // Version 3 frames predate dictionaries.
    let mut m = meta.clone();
    m.version = 3;
    expect_refused(&env, m, "version 3");
}

#[test]
fn corrupted_dictionaries_give_an_error_not_garbage() {
    let e = env(Backend::Local, 8 << 20);
    let env = e.env.with_chunk_rows(600);
    let frame = RemoteFrame::from_record_batches(&env, &[dictionary_batch()]).unwrap();
    let c = &frame.meta().chunks[0];
    let t = env.elements().transport(&c.element).unwrap();
    let read = |column: &str| {
        frame
            .record_batches(Some(&[column]), u64::MAX)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .map(|b| b.concat())
    };
    // Buffers of a column with nulls: validity, indices, views, data.
    let [_, indices, _] = c.columns[0].buffers[..] else {
        panic!("{:?}", c.columns[0].buffers)
    };
    // An index past the four strings.
    t.write(c.addr + indices.offset + 1, &[9]).unwrap();
    let err = read("short").unwrap_err();
    assert!(err.to_string().contains("dictionary index 9"), "{err}");
    // A long name's view pointing at a data buffer that does not exist.
    let views = c.columns[1].buffers[2];
    t.write(c.addr + views.offset + 8, &77u32.to_le_bytes())
        .unwrap();
    let err = read("long").unwrap_err();
    assert!(err.to_string().contains("buffer index"), "{err}");
    // The columns left alone still read.
    assert_eq!(read("many").unwrap()[0].num_rows(), 600);
}
