//! Stable element type names for [`crate::ArrayMeta::dtype`].
//!
//! Metadata travels between compute elements, processes, versions of this crate and
//! languages, so the element type it names must not depend on the compiler:
//! `std::any::type_name` is documented as unstable. The primitive numeric types have
//! fixed names shared with Python (as arrow names its native types), the set
//! [`DTYPES`]; any other `Pod` type (a `#[repr(C)]` struct, an array) is named
//! `rust:` + its type name, which only Rust code of the same build can rely on.

use std::any::TypeId;
use std::borrow::Cow;

use bytemuck::Pod;

/// The stable element type names, each with its NumPy dtype: `u8` (`uint8`), `i8`,
/// `u16`, `i16`, `u32`, `i32`, `u64`, `i64`, `f32` (`float32`), `f64` (`float64`).
pub const DTYPES: [&str; 10] = [
    "u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f32", "f64",
];

/// Prefix of the names of element types outside [`DTYPES`].
pub const RUST_PREFIX: &str = "rust:";

/// The name [`crate::ArrayMeta::dtype`] gives element type `T`: one of [`DTYPES`]
/// for the primitive numeric types (`usize`/`isize` by their width), else
/// `rust:<type name>`.
pub fn dtype_name<T: Pod>() -> Cow<'static, str> {
    let id = TypeId::of::<T>();
    let known: [(TypeId, &'static str); 10] = [
        (TypeId::of::<u8>(), "u8"),
        (TypeId::of::<i8>(), "i8"),
        (TypeId::of::<u16>(), "u16"),
        (TypeId::of::<i16>(), "i16"),
        (TypeId::of::<u32>(), "u32"),
        (TypeId::of::<i32>(), "i32"),
        (TypeId::of::<u64>(), "u64"),
        (TypeId::of::<i64>(), "i64"),
        (TypeId::of::<f32>(), "f32"),
        (TypeId::of::<f64>(), "f64"),
    ];
    if let Some((_, name)) = known.iter().find(|(t, _)| *t == id) {
        return Cow::Borrowed(name);
    }
    let width = std::mem::size_of::<T>();
    if id == TypeId::of::<usize>() {
        return Cow::Borrowed(if width == 8 { "u64" } else { "u32" });
    }
    if id == TypeId::of::<isize>() {
        return Cow::Borrowed(if width == 8 { "i64" } else { "i32" });
    }
    Cow::Owned(format!("{RUST_PREFIX}{}", std::any::type_name::<T>()))
}

/// True if metadata naming `found` may be opened as element type `T`: its stable
/// name, or what versions before the stable names wrote (`std::any::type_name`).
pub(crate) fn accepts<T: Pod>(found: &str) -> bool {
    found == dtype_name::<T>() || found == std::any::type_name::<T>()
}

/// The size in bytes of a type in [`DTYPES`], None for any other name.
pub fn dtype_size(name: &str) -> Option<usize> {
    Some(match name {
        "u8" | "i8" => 1,
        "u16" | "i16" => 2,
        "u32" | "i32" | "f32" => 4,
        "u64" | "i64" | "f64" => 8,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct Pair {
        a: u32,
        b: f32,
    }

    #[test]
    fn primitives_have_their_stable_names_and_sizes() {
        assert_eq!(dtype_name::<u8>(), "u8");
        assert_eq!(dtype_name::<i16>(), "i16");
        assert_eq!(dtype_name::<f32>(), "f32");
        assert_eq!(dtype_name::<f64>(), "f64");
        assert_eq!(dtype_name::<usize>(), format!("u{}", usize::BITS));
        assert_eq!(dtype_name::<isize>(), format!("i{}", isize::BITS));
        for name in DTYPES {
            assert!(dtype_size(name).is_some(), "{name}");
        }
        assert_eq!(dtype_size("f64"), Some(8));
        assert_eq!(dtype_size("float64"), None);
    }

    #[test]
    fn other_pod_types_are_named_as_rust_only() {
        let name = dtype_name::<Pair>();
        assert!(
            name.starts_with(RUST_PREFIX) && name.ends_with("Pair"),
            "{name}"
        );
        assert!(dtype_name::<[f32; 4]>().starts_with(RUST_PREFIX));
        assert_eq!(dtype_size(&name), None);
    }

    #[test]
    fn old_names_are_still_accepted_and_other_types_refused() {
        assert!(accepts::<f32>("f32"));
        assert!(accepts::<Pair>(std::any::type_name::<Pair>()));
        assert!(accepts::<Pair>(&dtype_name::<Pair>()));
        assert!(accepts::<usize>(&dtype_name::<usize>()));
        assert!(accepts::<usize>("usize"));
        assert!(!accepts::<f32>("i32"));
        assert!(!accepts::<u64>("f64"));
    }
}
