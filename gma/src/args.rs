//! Arguments shared by several subcommands: output format, the TLS of this process, the flags
//! every serving role shares ([`RoleArgs`], [`EndpointArgs`]), the slow-consumer policy. Each
//! subcommand's own arguments live in its module; cli.rs assembles the command.

use anyhow::bail;
use clap::ValueEnum;

// Shared with `gma-agent` (the producer crate): defined in gma_core::cli.
#[cfg(test)]
pub use gma_core::cli::CLIENT_HEADING;
pub use gma_core::cli::{ClientTlsArgs, EndpointArgs, RoleArgs, GLOBAL_HEADING, SERVING_HEADING};

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

impl Output {
    /// Prints a list: a JSON array of `json(item)`, or one `line(item)` an item and then the
    /// count (`3 jobs`, with `noun` = "jobs").
    pub fn print_list<T>(
        self,
        items: &[T],
        noun: &str,
        json: impl Fn(&T) -> serde_json::Value,
        line: impl Fn(&T) -> String,
    ) {
        match self {
            Output::Json => println!("{}", serde_json::Value::Array(items.iter().map(json).collect())),
            Output::Table => {
                for x in items {
                    println!("{}", line(x));
                }
                println!("{} {noun}", items.len());
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::endpoint::Endpoint;

    #[test]
    fn a_role_reads_its_config_or_its_defaults_and_says_how_to_give_a_required_one() {
        let none = RoleArgs::default();
        let e = none.config_file("the resources", "docs/broker.md").unwrap_err();
        assert_eq!(
            e.to_string(),
            "give the resources with --config FILE (docs/broker.md)"
        );
        let defaults: Endpoint = none.load().expect("defaults without --config");
        assert_eq!(defaults.rpc_events_ms, Endpoint::default().rpc_events_ms);

        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("role.toml");
        std::fs::write(&path, "rpc_events_ms = 7\n").expect("write config");
        let given = RoleArgs {
            config: Some(path.clone()),
            ..Default::default()
        };
        assert_eq!(given.config_file("x", "y").expect("given"), path.as_path());
        let read: Endpoint = given.load().expect("read --config");
        assert_eq!(read.rpc_events_ms, Some(7));
    }
}
