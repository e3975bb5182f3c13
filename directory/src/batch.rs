//! Write batching: concurrent commands become one raft entry.
//!
//! openraft 0.9 appends each client write as its own entry and waits for that append's
//! fdatasync before it takes the next one (`RaftCore::append_to_log`), so N concurrent writes
//! proposed one by one cost N fdatasyncs in a row on the leader. The [`Batcher`] keeps at most
//! [`IN_FLIGHT`] proposals in raft; commands that arrive meanwhile wait and go together, as one
//! [`Command::Batch`] entry, into the next proposal (etcd gets the same effect from its raft
//! node handing many proposals to one WAL save). Each command still gets its own reply: the
//! state machine applies a batch command by command, in order, and answers every one.
//!
//! To ensure correctness: a batch is only formed here, on the member that proposes; a `Batch`
//! arriving from outside (a forwarded write) is refused, and batches never nest.

use gma_core::Refuse;
use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::DirError;
use crate::raft::types::{Ack, Node, NodeId, Raft};
use crate::state::Command;

/// Proposals in raft at once (one being made durable, one waiting behind it).
pub const IN_FLIGHT: usize = 2;
/// Most commands in one entry.
pub const MAX_BATCH: usize = 512;
/// Commands waiting for a proposal (beyond it writers wait to queue: bounded memory).
const QUEUE: usize = 4096;

/// What raft answered for one command.
pub type WriteResult = Result<Result<Ack, DirError>, RaftError<NodeId, ClientWriteError<NodeId, Node>>>;

struct Queued {
    cmd: Command,
    done: oneshot::Sender<WriteResult>,
}

/// Hands commands to raft, batching those that wait.
pub struct Batcher {
    tx: mpsc::Sender<Queued>,
}

// openraft's RaftError is large; it is passed through to `propose` as openraft returns it.
#[allow(clippy::result_large_err)]
impl Batcher {
    /// Starts the batching task for `raft` (it ends when the batcher drops).
    pub fn start(raft: Raft) -> Batcher {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(raft, rx));
        Batcher { tx }
    }

    /// Proposes `cmd` (in a batch with whatever waits with it) and returns its own reply.
    pub async fn write(&self, cmd: Command) -> WriteResult {
        if matches!(cmd, Command::Batch(_)) {
            return Ok(Err(DirError::invalid_argument(
                "a batch of commands is formed by the member that proposes it, never sent to it",
            )));
        }
        let (done, rx) = oneshot::channel();
        if self.tx.send(Queued { cmd, done }).await.is_err() {
            return Ok(Err(DirError::unavailable(
                "the directory is shutting down: retry",
            )));
        }
        rx.await.unwrap_or_else(|_| {
            Ok(Err(DirError::unavailable(
                "the directory is shutting down: retry",
            )))
        })
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Queued>) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        // Wait for a free slot first: what arrives meanwhile joins the next batch.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(q) => batch.push(q),
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            propose(&raft, batch).await;
            drop(permit);
        });
    }
}

#[allow(clippy::result_large_err)]
async fn propose(raft: &Raft, mut batch: Vec<Queued>) {
    if batch.len() == 1 {
        let Some(q) = batch.pop() else { return };
        let r = raft.client_write(q.cmd).await.map(|resp| resp.data.0);
        let _ = q.done.send(r);
        return;
    }
    let (cmds, dones): (Vec<Command>, Vec<oneshot::Sender<WriteResult>>) =
        batch.into_iter().map(|q| (q.cmd, q.done)).unzip();
    let n = cmds.len();
    match raft.client_write(Command::Batch(cmds)).await {
        Ok(resp) => {
            let mut each = resp.data.1.into_iter();
            for done in dones {
                let r = each.next().unwrap_or_else(|| {
                    Err(DirError::Storage(format!(
                        "a batch of {n} commands was answered with fewer replies"
                    )))
                });
                let _ = done.send(Ok(r));
            }
        }
        Err(e) => {
            for done in dones {
                let _ = done.send(Err(e.clone()));
            }
        }
    }
}
