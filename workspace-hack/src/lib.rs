//! No code: this crate only pins the features of shared dependencies (see its
//! Cargo.toml), so every workspace binary reuses one compiled dependency stack.
