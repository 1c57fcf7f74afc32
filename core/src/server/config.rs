//! [`ServerConfig`]: a server's limits and tokens, and the checks run before it starts.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::protocol;

use super::parse_bytes;
#[cfg(doc)]
use super::{admit, MemoryServer};

/// Settings of a [`MemoryServer`].
///
/// Limits and their defaults:
///
/// | limit | field | default |
/// |---|---|---|
/// | connections served at once (more get `Busy`) | `max_connections` | 1024 |
/// | bytes of one frame (clients split larger transfers) | `max_frame` | 16 MiB + 64 KiB |
/// | bytes in flight per connection | one request at a time, so `max_frame` | |
/// | bytes in flight in total | `max_in_flight` | 512 MiB |
/// | wait for in-flight budget before `Busy` | `in_flight_wait` | 5 s |
/// | idle connection closed after | `idle_timeout` | 600 s |
/// | a started frame (or a new connection's hello) must arrive within | `request_timeout` | 30 s |
#[derive(Clone)]
pub struct ServerConfig {
    /// Shared secret that opens the whole address space. With no token (and no
    /// `regions`) the server is in protected mode: it serves only clients on this host
    /// (see [`admit`]) unless `unprotected` is set.
    pub token: Option<String>,
    /// Parts of the address space with their own tokens. A client whose hello carries
    /// a region's token sees only that region, as an address space of its own starting
    /// at 0, so applications sharing a server cannot reach each other's bytes.
    /// Configuring regions turns authentication on even without `token`.
    pub regions: Vec<RegionGrant>,
    /// Largest frame body accepted or sent. A connection handles one request at a
    /// time, so this also bounds the bytes one connection has in flight. Between
    /// requests a connection keeps at most 2 MiB of receive buffer and 128 KiB of
    /// socket buffers (a larger buffer grown for one frame is given back).
    pub max_frame: u32,
    /// Connections served at once; more are refused with a `Busy` error.
    pub max_connections: usize,
    /// Bytes of request and reply data all connections together may have in flight
    /// (a write's payload while it is buffered, a read's reply while it is sent). A
    /// request that would exceed it waits up to `in_flight_wait` for others to finish,
    /// then gets a `Busy` error (a write is refused before its payload is read, and its
    /// connection closed; a read is refused and its connection kept).
    pub max_in_flight: u64,
    /// How long a request waits for in-flight budget before it is refused as `Busy`.
    pub in_flight_wait: Duration,
    /// A connection idle this long between requests is closed (with an `IdleTimeout`
    /// notice); `None` waits forever.
    pub idle_timeout: Option<Duration>,
    /// Once a frame has started, all of it must arrive within this time, and a new
    /// connection must send its hello within it; a reply must be taken by the client
    /// within it too. Otherwise the connection is closed with `RequestTimeout`, so a
    /// stalled client cannot hold a worker. `None` waits forever (up to `idle_timeout`).
    pub request_timeout: Option<Duration>,
    /// Serve clients on other hosts even without a token (`--unprotected`,
    /// `SCAD_UNPROTECTED=1`): anyone who can reach the port may then read and write the
    /// whole address space. Off by default (protected mode, as in Redis; see [`admit`]).
    pub unprotected: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            regions: Vec::new(),
            max_frame: protocol::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            max_in_flight: 512 << 20,
            in_flight_wait: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(600)),
            request_timeout: Some(Duration::from_secs(30)),
            unprotected: false,
        }
    }
}

impl fmt::Debug for ServerConfig {
    /// Never prints tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("regions", &self.regions)
            .field("max_frame", &self.max_frame)
            .field("max_connections", &self.max_connections)
            .field("max_in_flight", &self.max_in_flight)
            .field("in_flight_wait", &self.in_flight_wait)
            .field("idle_timeout", &self.idle_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("unprotected", &self.unprotected)
            .finish()
    }
}

/// A named part of the served address space and the token that opens it.
#[derive(Clone, PartialEq, Eq)]
pub struct RegionGrant {
    /// Name, for logs and errors.
    pub name: String,
    /// First byte of the region in the served address space.
    pub offset: u64,
    /// Bytes of the region.
    pub len: u64,
    /// The token a client presents to reach this region (and nothing else).
    pub token: String,
}

impl fmt::Debug for RegionGrant {
    /// Never prints the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionGrant")
            .field("name", &self.name)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl RegionGrant {
    /// Parses `NAME:OFFSET:LEN:TOKEN` (offset and length in bytes, or with a K, M, G or
    /// T suffix for powers of 1024), the form `memory_server --region` takes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the bad part (the token is never quoted).
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("region spec: {why}"));
        let mut parts = spec.splitn(4, ':');
        let (Some(name), Some(offset), Some(len), Some(token)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected NAME:OFFSET:LEN:TOKEN".into()));
        };
        let offset = parse_bytes(offset).map_err(|e| bad(format!("offset: {e}")))?;
        let len = parse_bytes(len).map_err(|e| bad(format!("length: {e}")))?;
        Ok(RegionGrant {
            name: name.to_owned(),
            offset,
            len,
            token: token.to_owned(),
        })
    }
}

/// Checks the region grants against each other, the global token and the region size.
pub(super) fn check_regions(config: &ServerConfig, size: u64) -> std::result::Result<(), String> {
    if let Some(t) = &config.token {
        if t.is_empty() || t.len() > protocol::MAX_TOKEN {
            return Err(format!(
                "the token must have 1 to {} bytes",
                protocol::MAX_TOKEN
            ));
        }
    }
    for (i, g) in config.regions.iter().enumerate() {
        if g.name.is_empty() {
            return Err(format!("region {i} has no name"));
        }
        if g.token.is_empty() || g.token.len() > protocol::MAX_TOKEN {
            return Err(format!(
                "region {:?}: its token must have 1 to {} bytes",
                g.name,
                protocol::MAX_TOKEN
            ));
        }
        if g.len == 0 || g.offset.checked_add(g.len).is_none_or(|end| end > size) {
            return Err(format!(
                "region {:?} ({} bytes at {}) does not fit the address space of {size} bytes",
                g.name, g.len, g.offset
            ));
        }
        for other in &config.regions[..i] {
            if other.name == g.name {
                return Err(format!("two regions are named {:?}", g.name));
            }
            if other.token == g.token {
                return Err(format!(
                    "regions {:?} and {:?} have the same token",
                    other.name, g.name
                ));
            }
        }
        if config.token.as_deref() == Some(g.token.as_str()) {
            return Err(format!("region {:?} has the server's global token", g.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_debug_hides_tokens() {
        let config = ServerConfig {
            token: Some("global-secret".into()),
            regions: vec![RegionGrant::parse("a:0:1K:region-secret").unwrap()],
            ..ServerConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("max_in_flight"));
    }
}
