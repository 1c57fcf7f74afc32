//! `memory_server [PORT] [IMPL]`: serves one Scad memory element (see the library docs
//! of `scad_core::cli` for the command line).

use std::io::IsTerminal;

use anyhow::Result;
use clap::Parser;
use scad_core::cli::{run, Args};
use tracing_subscriber::EnvFilter;

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours for people, plain text for log files and pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    run(&Args::parse())
}
