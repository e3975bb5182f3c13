//! Arguments shared by several subcommands: output format, the TLS of this process, the flags
//! every serving role shares ([`RoleArgs`], [`EndpointArgs`]), the slow-consumer policy. Each
//! subcommand's own arguments live in its module; cli.rs assembles the command.

use anyhow::bail;
use clap::ValueEnum;

// Shared with `gma-agent` (the producer crate): defined in gma_core::cli.
#[cfg(test)]
pub use gma_core::cli::CLIENT_HEADING;
pub use gma_core::cli::{
    load_config, ClientTlsArgs, EndpointArgs, RoleArgs, GLOBAL_HEADING, SERVING_HEADING,
};

/// The directory a role registers in, required: the error says how to give it.
pub fn require_directory(directory: &Option<String>) -> anyhow::Result<()> {
    if directory.as_deref().is_none_or(|d| d.trim().is_empty()) {
        bail!("give the directory with --directory ADDR (or directory in --config)");
    }
    Ok(())
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Also spelled `text`.
    #[value(alias = "text")]
    Table,
    Json,
}

/// What the producer does when a subscriber falls behind.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Conflate to the newest value per series.
    Latest,
    /// Skip the oldest events, reported as a gap.
    DropOldest,
    /// Hold events for this subscriber (archivers), within the producer's block reserve.
    Block,
}
