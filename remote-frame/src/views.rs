//! String views read back from memory elements, checked buffer by buffer.
//!
//! Memory elements are not trusted: a string column read back must be valid UTF-8
//! and its views must stay inside their buffers, or the read fails. arrow's
//! `StringViewArray::try_new` checks each string on its own, one UTF-8 validation per
//! value (4 % of the SF 1 main job's CPU). [`string_views`] validates each data buffer
//! once and then checks each view's bounds, prefix and character boundaries, which
//! proves the same of every string. Anything it does not accept goes to `try_new`,
//! so malformed input fails with arrow's own error.

use arrow_array::{Array, StringViewArray};
use arrow_buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow_data::ByteView;
use arrow_schema::ArrowError;

/// Longest string kept inside its view.
const INLINE_LEN: u32 = 12;

/// A `StringViewArray` of `views` over `data`, as `StringViewArray::try_new`
/// would build it (and failing where it fails), validated in fewer steps.
pub(crate) fn string_views(
    views: ScalarBuffer<u128>,
    data: Vec<Buffer>,
    nulls: Option<NullBuffer>,
) -> Result<StringViewArray, ArrowError> {
    if !all_valid(&views, &data, nulls.as_ref()) {
        return StringViewArray::try_new(views, data, nulls);
    }
    // SAFETY: `all_valid` checked what `try_new` checks: the null buffer's length,
    // and for each view either an inline string of valid UTF-8 with zero padding, or
    // a buffer index that exists, a range inside that buffer starting with the view's
    // prefix, and (the buffer being valid UTF-8 as a whole) a range starting and ending
    // on character boundaries, so that the string is valid UTF-8 too.
    Ok(unsafe { StringViewArray::new_unchecked(views, data, nulls) })
}

/// The strings at `rows` of `array` (repeats allowed), their long strings copied
/// into one buffer of exactly their size: the pieces a partitioner or a filter cuts
/// hold only their own strings, in one pass and without checking again what `array`
/// already proved. `None` when the strings would not fit one buffer (4 GiB).
pub(crate) fn gather_views(array: &StringViewArray, rows: &[u32]) -> Option<StringViewArray> {
    let views = array.views();
    let nulls = array.nulls();
    let valid = |row: usize| nulls.is_none_or(|n| n.is_valid(row));
    let long: usize = rows
        .iter()
        .map(|&r| r as usize)
        .filter(|&r| valid(r) && views[r] as u32 > INLINE_LEN)
        .map(|r| views[r] as u32 as usize)
        .sum();
    u32::try_from(long).ok()?;
    let buffers = array.data_buffers();
    let mut data = Vec::with_capacity(long);
    let mut gathered = Vec::with_capacity(rows.len());
    for &row in rows {
        let row = row as usize;
        let view = views[row];
        let len = view as u32;
        if !valid(row) {
            // A null's view is never read; an empty one points nowhere.
            gathered.push(0);
        } else if len <= INLINE_LEN {
            gathered.push(view);
        } else {
            let mut copied = ByteView::from(view);
            let start = copied.offset as usize;
            let offset = data.len();
            data.extend_from_slice(
                &buffers[copied.buffer_index as usize][start..start + len as usize],
            );
            copied.buffer_index = 0;
            // At most `long`, which fits a u32 (checked above).
            copied.offset = offset as u32;
            gathered.push(copied.as_u128());
        }
    }
    let nulls = nulls.map(|n| NullBuffer::from_iter(rows.iter().map(|&r| n.is_valid(r as usize))));
    let data = if data.is_empty() {
        vec![]
    } else {
        vec![Buffer::from_vec(data)]
    };
    // SAFETY: `array` is a valid view array (arrow's constructors and ours check
    // that), so each of its non-null views is an inline string of valid UTF-8 or
    // points at valid UTF-8 inside its buffers. Each gathered view is either such an
    // inline view unchanged, the empty view of a null, or a long view whose length
    // and prefix are unchanged and that points at a verbatim copy of its string in
    // buffer 0 (the slicing above panics rather than read out of bounds). The null
    // buffer has one bit per gathered view.
    Some(unsafe { StringViewArray::new_unchecked(ScalarBuffer::from(gathered), data, nulls) })
}

/// The strings of `dictionary` at `indices`, one per row, sharing its data buffers:
/// a column chunk stored as a dictionary, read back. `nulls` (one bit per index) marks
/// the rows that are null.
///
/// # Errors
/// An index past the dictionary, or `nulls` of another length.
pub(crate) fn dictionary_views<I: Copy + Into<usize>>(
    dictionary: &StringViewArray,
    indices: &[I],
    nulls: Option<NullBuffer>,
) -> Result<StringViewArray, ArrowError> {
    let entries = dictionary.views();
    // One pass for the bound (null slots included: they hold 0) keeps the gather
    // below free of checks.
    let largest = indices.iter().map(|&i| i.into()).max().unwrap_or(0);
    if !indices.is_empty() && largest >= entries.len() {
        return Err(ArrowError::InvalidArgumentError(format!(
            "dictionary index {largest} past the dictionary's {} strings",
            entries.len()
        )));
    }
    if nulls.as_ref().is_some_and(|n| n.len() != indices.len()) {
        return Err(ArrowError::InvalidArgumentError(format!(
            "{} null bits for {} dictionary indices",
            nulls.map_or(0, |n| n.len()),
            indices.len()
        )));
    }
    let views: Vec<u128> = indices.iter().map(|&i| entries[i.into()]).collect();
    // SAFETY: `dictionary` is a valid view array (built by checked constructors), so
    // each of its views is an inline string of valid UTF-8 or points at valid UTF-8
    // inside its buffers; every view here is a copy of one of them (the indices were
    // bounded above) over the same buffers, and the null buffer has one bit per view.
    Ok(unsafe {
        StringViewArray::new_unchecked(
            ScalarBuffer::from(views),
            dictionary.data_buffers().to_vec(),
            nulls,
        )
    })
}

/// Checks `array` as [`string_views`] checks its parts: `Ok` where
/// `StringViewArray::try_new` would accept them, arrow's own error where it would not.
/// For arrays decoded without validation (spilled batches read back).
pub(crate) fn check_string_views(array: &StringViewArray) -> Result<(), ArrowError> {
    if all_valid(array.views(), array.data_buffers(), array.nulls()) {
        return Ok(());
    }
    StringViewArray::try_new(
        array.views().clone(),
        array.data_buffers().to_vec(),
        array.nulls().cloned(),
    )
    .map(|_| ())
}

/// Whether `try_new` would accept these parts (see [`string_views`]).
fn all_valid(views: &[u128], data: &[Buffer], nulls: Option<&NullBuffer>) -> bool {
    if nulls.is_some_and(|n| n.len() != views.len()) {
        return false;
    }
    let Some(texts) = data
        .iter()
        .map(|b| std::str::from_utf8(b.as_slice()).ok())
        .collect::<Option<Vec<&str>>>()
    else {
        return false;
    };
    views.iter().all(|&v| {
        let len = v as u32;
        if len <= INLINE_LEN {
            if len < INLINE_LEN && v >> (32 + len * 8) != 0 {
                return false;
            }
            let bytes = v.to_le_bytes();
            let inline = &bytes[4..4 + len as usize];
            inline.is_ascii() || std::str::from_utf8(inline).is_ok()
        } else {
            let view = ByteView::from(v);
            let start = view.offset as usize;
            let Some(text) = texts.get(view.buffer_index as usize) else {
                return false;
            };
            // `get` is None outside the text or off a character boundary.
            start
                .checked_add(len as usize)
                .and_then(|end| text.get(start..end))
                .is_some_and(|s| s.as_bytes().starts_with(&view.prefix.to_le_bytes()))
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use arrow_array::Array;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn long_view(len: u32, buffer: u32, offset: u32, data: &[u8]) -> u128 {
        let mut prefix = [0u8; 4];
        let from = (offset as usize).min(data.len());
        let take = (data.len() - from).min(4);
        prefix[..take].copy_from_slice(&data[from..from + take]);
        ByteView {
            length: len,
            prefix: u32::from_le_bytes(prefix),
            buffer_index: buffer,
            offset,
        }
        .into()
    }

    fn inline_view(s: &[u8]) -> u128 {
        let mut bytes = [0u8; 16];
        bytes[..4].copy_from_slice(&(s.len() as u32).to_le_bytes());
        bytes[4..4 + s.len()].copy_from_slice(s);
        u128::from_le_bytes(bytes)
    }

    /// Ours and arrow's agree: both accept (the same array) or both refuse.
    fn agree(views: Vec<u128>, data: Vec<Vec<u8>>, nulls: Option<NullBuffer>) -> bool {
        let buffers: Vec<Buffer> = data.into_iter().map(Buffer::from_vec).collect();
        let views = ScalarBuffer::from(views);
        let ours = string_views(views.clone(), buffers.clone(), nulls.clone());
        let arrow = StringViewArray::try_new(views, buffers, nulls);
        match (ours, arrow) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b);
                true
            }
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string());
                false
            }
            (a, b) => panic!("ours {a:?}, arrow's {b:?}"),
        }
    }

    #[test]
    fn valid_views_are_taken_as_they_are() {
        let data = "héllo wörld, a longer string€".as_bytes().to_vec();
        let len = data.len() as u32;
        let views = vec![
            inline_view(b"short"),
            inline_view("née".as_bytes()),
            inline_view(b""),
            long_view(len, 0, 0, &data),
            long_view(13, 0, 1, &data),
        ];
        let nulls = Some(NullBuffer::from(vec![true, false, true, true, true]));
        assert!(agree(views.clone(), vec![data.clone()], nulls));
        let array = string_views(
            ScalarBuffer::from(views),
            vec![Buffer::from_vec(data)],
            None,
        )
        .unwrap();
        assert_eq!(array.value(3), "héllo wörld, a longer string€");
        assert_eq!(array.value(4), "éllo wörld,");
        assert_eq!(array.len(), 5);
    }

    #[test]
    fn every_malformed_view_fails_as_arrow_fails() {
        let text = "héllo wörld, a longer string".as_bytes().to_vec();
        let len = text.len() as u32;
        type Case<'a> = (&'a str, Vec<u128>, Vec<Vec<u8>>, Option<NullBuffer>);
        let cases: Vec<Case> = vec![
            (
                "buffer not UTF-8",
                vec![long_view(13, 0, 0, &[0xff; 20])],
                vec![vec![0xff; 20]],
                None,
            ),
            (
                "no such buffer",
                vec![long_view(13, 1, 0, &text)],
                vec![text.clone()],
                None,
            ),
            (
                "past the end",
                vec![long_view(len, 0, 1, &text)],
                vec![text.clone()],
                None,
            ),
            (
                "offset overflows",
                vec![long_view(13, 0, u32::MAX, &text)],
                vec![text.clone()],
                None,
            ),
            // "é" is two bytes at 1..3: a string starting at 2 starts mid-character.
            (
                "mid-character start",
                vec![long_view(13, 0, 2, &text)],
                vec![text.clone()],
                None,
            ),
            (
                "mid-character end",
                vec![long_view(13, 0, 0, "ab€€€€€€".as_bytes())],
                vec!["ab€€€€€€".as_bytes().to_vec()],
                None,
            ),
            (
                "wrong prefix",
                vec![long_view(13, 0, 0, b"xxxx")],
                vec![text.clone()],
                None,
            ),
            (
                "inline not UTF-8",
                vec![inline_view(&[0xc3, 0x28])],
                vec![],
                None,
            ),
            (
                "inline padding",
                vec![inline_view(b"ab") | (1u128 << 100)],
                vec![],
                None,
            ),
            (
                "nulls too short",
                vec![inline_view(b"ab"); 3],
                vec![],
                Some(NullBuffer::new_null(2)),
            ),
        ];
        for (what, views, data, nulls) in cases {
            assert!(!agree(views, data, nulls), "{what}: accepted");
        }
    }

    #[test]
    fn random_views_are_judged_as_arrow_judges_them() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        // Mostly one-byte characters, some of two, three and four bytes.
        let text = "abcdefghijklmnopqrstuvwxyzé0123456789€ABCDEFGHIJKLMNOPQRSTUVWXYZ𝄞"
            .repeat(2)
            .into_bytes();
        let mut accepted = 0;
        for _ in 0..5_000 {
            let views: Vec<u128> = (0..2)
                .map(|_| {
                    if rng.gen_bool(0.3) {
                        let n = rng.gen_range(0..=12usize);
                        let start = rng.gen_range(0..text.len() - n);
                        inline_view(&text[start..start + n])
                    } else {
                        let len = rng.gen_range(13..40u32);
                        let offset = rng.gen_range(0..text.len() as u32);
                        let buffer = u32::from(rng.gen_bool(0.5)) + u32::from(rng.gen_bool(0.05));
                        long_view(len, buffer, offset, &text)
                    }
                })
                .collect();
            if agree(views, vec![text.clone(), text[5..].to_vec()], None) {
                accepted += 1;
            }
        }
        // Both outcomes were tried many times.
        assert!((500..4_500).contains(&accepted), "{accepted} accepted");
    }

    #[test]
    fn gathered_views_equal_taken_ones_and_hold_only_their_strings() {
        use arrow_array::builder::StringViewBuilder;
        use arrow_array::UInt32Array;

        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        // Small blocks: the strings spread over many buffers.
        let mut builder = StringViewBuilder::new().with_fixed_block_size(256);
        for i in 0..2_000 {
            match i % 5 {
                0 => builder.append_null(),
                1 => builder.append_value(format!("s{i}")),
                _ => {
                    builder.append_value(format!("a longer string, né {i} {}", "x".repeat(i % 40)))
                }
            }
        }
        let array = builder.finish();
        assert!(array.data_buffers().len() > 10);
        for n in [0, 1, 700, 5_000] {
            // Repeats and any order.
            let rows: Vec<u32> = (0..n).map(|_| rng.gen_range(0..2_000)).collect();
            let gathered = gather_views(&array, &rows).unwrap();
            let taken =
                datafusion::arrow::compute::take(&array, &UInt32Array::from(rows.clone()), None)
                    .unwrap();
            assert_eq!(&gathered as &dyn Array, taken.as_ref());
            let long: usize = rows
                .iter()
                .filter(|&&r| array.is_valid(r as usize))
                .map(|&r| array.value(r as usize).len())
                .filter(|&l| l > 12)
                .sum();
            let held: usize = gathered.data_buffers().iter().map(|b| b.len()).sum();
            assert_eq!(held, long);
            assert!(gathered.data_buffers().len() <= 1);
            // What arrow's own checks make of it.
            gathered.to_data().validate_full().unwrap();
        }
    }
}
