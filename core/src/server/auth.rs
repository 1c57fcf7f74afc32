//! Which part of the address space a hello's token opens.

use subtle::ConstantTimeEq;

use super::Shared;

/// The part of the address space one authenticated connection may reach; its
/// requests address it from 0.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    pub(super) base: u64,
    pub(super) len: u64,
}

/// The window a hello token opens, if any. Every configured token is compared, in
/// constant time, whatever matches, so timing tells nothing about which one was close.
pub(super) fn authorize<'a>(shared: &'a Shared, token: &[u8]) -> Option<(Window, Option<&'a str>)> {
    let config = &shared.config;
    let whole = Window {
        base: 0,
        len: shared.region.size(),
    };
    if config.token.is_none() && config.regions.is_empty() {
        return Some((whole, None));
    }
    let mut found = None;
    if let Some(expected) = &config.token {
        if bool::from(expected.as_bytes().ct_eq(token)) {
            found = Some((whole, None));
        }
    }
    for g in &config.regions {
        let hit = bool::from(g.token.as_bytes().ct_eq(token));
        if hit && found.is_none() {
            found = Some((
                Window {
                    base: g.offset,
                    len: g.len,
                },
                Some(g.name.as_str()),
            ));
        }
    }
    found
}
