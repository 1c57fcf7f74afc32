//! Remote arrays (work in progress).
