//! `gma bench directory` (being written).

use crate::cli::Output;

pub async fn run(_duration: u64, _trials: u32, _output: Output) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
