//! What every serving subcommand shares: binding its listener (plaintext refused off loopback),
//! the shutdown signal, and the security flags (`--tls-*`, `--access-policy`) applied over the
//! role's config (the other shared flags: [`crate::args::EndpointArgs::apply`]; opening a
//! role's endpoint: [`crate::runtime`]). They live in `gma_core::cli`, shared with `gma-agent`.

pub use gma_core::cli::{
    allow_plaintext_flag, bind, bind_checked, catch_shutdown_signals, set_security, shutdown_signal,
};
