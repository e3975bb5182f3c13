//! `gma broker provision`: plans a workflow onto offered slots (docs/provisioning.md), prints
//! the Pareto set and the plan chosen by α, and with `--reserve` reserves that plan's slots at
//! the resource managers (all or none).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use gma_broker::provision::free::{free_slots, Capacity};
use gma_broker::provision::{
    choose, moga, MogaConfig, Offer, Outcome, Plan, Problem, Schedule, Slot, Workflow,
};
use gma_broker::remote::RemoteReserver;
use gma_broker::reserve::{Answer, Reservation, ReserveRequest, Reserver};
use gma_proto::v1::{self as pb, reservations_client::ReservationsClient};
use serde_json::json;

use crate::args::Output;

/// Longest a call to a resource manager may take.
const CALL: Duration = Duration::from_secs(30);
/// Offered horizon when a manager has none.
const DEFAULT_HORIZON_S: i64 = 86_400;

#[derive(Args, Debug)]
pub struct ProvisionArgs {
    /// Workflow file (TOML: [[task]] id, runtime_s, processors; [[edge]] from, to, data_mb).
    #[arg(long)]
    workflow: PathBuf,
    /// Trade-off factor in [0, 1] (Eq 8): 0 = the fastest plan of the Pareto set, 1 = the cheapest.
    #[arg(long)]
    alpha: f64,
    /// Slot offers (TOML: [[slot]] resource, start_s, end_s, processors, price). Without it the
    /// offer is what --broker holds, or the free capacity of the --simres managers.
    #[arg(long, conflicts_with = "broker")]
    slots: Option<PathBuf>,
    /// A broker (gma broker) following the managers' rm.slots: plan on the slot offers it holds,
    /// and reserve (--reserve) at the managers that offered them.
    #[arg(long)]
    broker: Option<String>,
    /// Resource managers (gma simres), ADDR[,ADDR...]: where the offer comes from (unless
    /// --slots) and where --reserve reserves.
    #[arg(long = "simres", value_delimiter = ',')]
    simres: Vec<String>,
    /// Reserve the chosen plan's slots at the managers (all or none).
    #[arg(long)]
    reserve: bool,
    /// Owner of the reservations.
    #[arg(long, default_value = "provision")]
    owner: String,
    /// Offers from managers: cut free time into slots of at most this many seconds.
    #[arg(long, default_value_t = 3600)]
    slot_s: i64,
    /// Offers from managers: slots start this many seconds from now (time to plan and reserve).
    #[arg(long, default_value_t = 60)]
    lead_s: i64,
    /// Offers from managers: service units per processor-hour.
    #[arg(long, default_value_t = 1.0)]
    price: f64,
    /// Offers from managers: the price of one resource, NAME=SU (repeatable).
    #[arg(long = "resource-price", value_parser = parse_price)]
    resource_price: Vec<(String, f64)>,
    /// MOGA population.
    #[arg(long, default_value_t = 60)]
    population: usize,
    /// MOGA generations.
    #[arg(long, default_value_t = 40)]
    generations: usize,
    /// MOGA random seed (the same seed and inputs give the same answer).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
}

/// `--resource-price NAME=SU` (clap's value parser: its error goes into clap's message).
fn parse_price(s: &str) -> anyhow::Result<(String, f64)> {
    let (name, su) = s.split_once('=').ok_or_else(|| anyhow!("give NAME=SU"))?;
    let su: f64 = su.parse().map_err(|_| anyhow!("{su:?} is not a number"))?;
    if name.is_empty() || !(su.is_finite() && su >= 0.0) {
        bail!("give a resource name and a price >= 0");
    }
    Ok((name.to_string(), su))
}

fn read(path: &PathBuf, what: &str) -> anyhow::Result<String> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {what} file {}", path.display()))?;
    if meta.len() > 64 << 20 {
        bail!("{what} file {} is over 64 MiB", path.display());
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {what} file {}", path.display()))
}

pub async fn run(a: ProvisionArgs) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&a.alpha) {
        bail!("--alpha must be within 0..=1 (0: fastest plan, 1: cheapest)");
    }
    if a.population < 2 || a.population > 10_000 || a.generations > 10_000 {
        bail!("--population must be within 2..=10000 and --generations at most 10000");
    }
    if a.reserve && a.simres.is_empty() && a.broker.is_none() {
        bail!("--reserve needs the resource managers: give --simres ADDR[,ADDR...] or --broker ADDR");
    }
    let workflow = Workflow::from_toml(&read(&a.workflow, "workflow")?)
        .map_err(|e| anyhow!("invalid workflow file {}: {e}", a.workflow.display()))?;
    let (offer, managers) = match (&a.slots, &a.broker) {
        (Some(path), _) => (
            Offer::from_toml(&read(path, "slot")?)
                .map_err(|e| anyhow!("invalid slot file {}: {e}", path.display()))?,
            a.simres.clone(),
        ),
        (None, Some(broker)) => offer_from_broker(&a, broker).await?,
        (None, None) if a.simres.is_empty() => {
            bail!("give the offer: --slots FILE, --broker ADDR or --simres ADDR")
        }
        (None, None) => (offer_from_managers(&a).await?, a.simres.clone()),
    };
    let problem = Problem::new(workflow, offer);
    let cfg = MogaConfig {
        population: a.population,
        generations: a.generations,
        seed: a.seed,
        ..MogaConfig::default()
    };
    let started = std::time::Instant::now();
    let out = moga(&problem, &cfg);
    let took = started.elapsed();
    let Some(pick) = choose(&out.front, a.alpha) else {
        bail!(
            "no feasible plan: the workflow fits no combination of the {} slots tried ({} plans evaluated); offer longer or larger slots",
            problem.slots(),
            out.evaluations
        );
    };
    let chosen = &out.front[pick];
    let schedule = problem
        .schedule(&chosen.slots)
        .ok_or_else(|| anyhow!("the chosen plan is no longer feasible (a bug: please report)"))?;
    let held = if a.reserve {
        reserve(&managers, &a.owner, &problem, chosen).await?
    } else {
        Vec::new()
    };
    let source = match (&a.slots, &a.broker) {
        (Some(_), _) => "file",
        (None, Some(_)) => "broker",
        (None, None) => "managers",
    };
    let report = Report {
        source,
        p: &problem,
        out: &out,
        pick,
        s: &schedule,
        held: &held,
        alpha: a.alpha,
        took,
    };
    match a.output {
        Output::Json => println!("{}", report.json()),
        Output::Table => report.print(),
    }
    Ok(())
}

async fn manager(addr: &str) -> anyhow::Result<ReservationsClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(ReservationsClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

async fn bounded<T>(
    addr: &str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(CALL, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => bail!("resource manager {addr}: {} ({:?})", s.message(), s.code()),
        Err(_) => bail!("resource manager {addr} did not answer within {CALL:?}"),
    }
}

/// The free capacity of every resource of the managers, from now + lead to its horizon.
async fn offer_from_managers(a: &ProvisionArgs) -> anyhow::Result<Offer> {
    if a.slot_s < 1 || !(0..=86_400).contains(&a.lead_s) || !(a.price.is_finite() && a.price >= 0.0) {
        bail!("--slot-s must be >= 1, --lead-s within 0..=86400, --price >= 0");
    }
    let now_s = gma_core::time::now_ns() / 1_000_000_000;
    let from_s = now_s + a.lead_s;
    let mut caps = Vec::new();
    for addr in &a.simres {
        let mut c = manager(addr).await?;
        let res = bounded(addr, c.resources(pb::ResourcesRequest {})).await?;
        let held = bounded(
            addr,
            c.list(pb::ListReservationsRequest {
                from_s,
                ..Default::default()
            }),
        )
        .await?;
        for r in res.resources {
            let horizon = if r.horizon_s > 0 {
                r.horizon_s
            } else {
                DEFAULT_HORIZON_S
            };
            let price = a
                .resource_price
                .iter()
                .find(|(n, _)| *n == r.name)
                .map_or(a.price, |p| p.1);
            caps.push(Capacity {
                reserved: held
                    .reservations
                    .iter()
                    .filter(|x| x.resource == r.name)
                    .map(|x| (x.start_s, x.end_s, x.cpus))
                    .collect(),
                resource: r.name,
                cpus: r.cpus,
                until_s: now_s + horizon,
                price,
            });
        }
    }
    let slots = free_slots(from_s, a.slot_s, &caps);
    Offer::new(now_s, 100.0, 0, slots)
        .map_err(|e| anyhow!("the managers' free capacity is no valid offer: {e}"))
}

/// The slot offers `broker` holds (followed from the managers' `rm.slots`), from now +
/// lead, and the managers to reserve at: `--simres` when given, else the addresses the
/// offers came from.
async fn offer_from_broker(a: &ProvisionArgs, broker: &str) -> anyhow::Result<(Offer, Vec<String>)> {
    if !(0..=86_400).contains(&a.lead_s) {
        bail!("--lead-s must be within 0..=86400");
    }
    let ch = gma_consumer::connect(broker).await?;
    let mut c =
        pb::broker_client::BrokerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
    let view = match tokio::time::timeout(CALL, c.view(pb::BrokerViewRequest {})).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => bail!("broker {broker}: {} ({:?})", s.message(), s.code()),
        Err(_) => bail!("broker {broker} did not answer within {CALL:?}"),
    };
    let now_s = gma_core::time::now_ns() / 1_000_000_000;
    let from_s = now_s + a.lead_s;
    let mut managers = a.simres.clone();
    let mut slots = Vec::new();
    for v in view.slots {
        if v.end_s <= from_s {
            continue;
        }
        if a.simres.is_empty() && !v.address.is_empty() && !managers.contains(&v.address) {
            managers.push(v.address.clone());
        }
        slots.push(Slot {
            id: v.slot,
            resource: v.resource,
            start_s: v.start_s.max(from_s),
            end_s: v.end_s,
            processors: v.processors,
            price: v.price,
            fee: 0.0,
        });
    }
    if slots.is_empty() {
        bail!(
            "broker {broker} holds no slot offers ending after {from_s}: are resource managers publishing rm.slots, and does the broker follow it?"
        );
    }
    let offer = Offer::new(now_s, 100.0, 0, slots)
        .map_err(|e| anyhow!("the broker's slot offers are no valid offer: {e}"))?;
    Ok((offer, managers))
}

/// Reserves every slot of the plan whole at `managers`; on any refusal or failure releases
/// what it got.
async fn reserve(
    managers: &[String],
    owner: &str,
    p: &Problem,
    plan: &Plan,
) -> anyhow::Result<Vec<Reservation>> {
    if managers.is_empty() {
        bail!("no resource manager to reserve at: the offers carry no address; give --simres ADDR");
    }
    let rm = RemoteReserver::connect(managers)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let mut held: Vec<Reservation> = Vec::new();
    let mut failure = None;
    for &i in &plan.slots {
        let s = &p.offer.slots[i];
        let req = ReserveRequest {
            resource: s.resource.clone(),
            cpus: s.processors,
            duration_s: s.end_s - s.start_s,
            earliest_s: s.start_s,
            latest_s: s.start_s,
            flexible: false,
            owner: owner.to_string(),
        };
        match rm.reserve(&req).await {
            Ok(Answer::Granted(r)) => held.push(r),
            Ok(Answer::Never(why)) => failure = Some(format!("slot {} refused: {why}", s.id)),
            Ok(Answer::Retry { from_s, reason }) => {
                failure = Some(format!(
                    "slot {} refused: {reason} (possible from {from_s})",
                    s.id
                ))
            }
            Err(e) => failure = Some(format!("slot {}: {e}", s.id)),
        }
        if failure.is_some() {
            break;
        }
    }
    let Some(why) = failure else { return Ok(held) };
    let mut leaked = Vec::new();
    for r in &held {
        if let Err(e) = rm.release(&r.id, owner).await {
            leaked.push(format!("{} ({e})", r.id));
        }
    }
    if leaked.is_empty() {
        bail!(
            "{why}; the {} reservations made for the plan were released: plan again",
            held.len()
        );
    }
    bail!(
        "{why}; could not release {}: release them with gma simres release",
        leaked.join(", ")
    )
}

fn plan_json(p: &Problem, plan: &Plan) -> serde_json::Value {
    json!({
        "cost_su": plan.cost,
        "makespan_s": plan.makespan_s,
        "slots": plan.slots.iter().map(|&i| p.offer.slots[i].id.as_str()).collect::<Vec<_>>(),
    })
}

/// What a run found and did, for printing.
struct Report<'a> {
    /// Where the offer came from: file, broker or managers.
    source: &'static str,
    p: &'a Problem,
    out: &'a Outcome,
    pick: usize,
    s: &'a Schedule,
    held: &'a [Reservation],
    alpha: f64,
    took: Duration,
}

impl Report<'_> {
    fn json(&self) -> serde_json::Value {
        let Report {
            source,
            p,
            out,
            pick,
            s,
            held,
            alpha,
            took,
        } = *self;
        let wf = &p.workflow;
        let chosen = &out.front[pick];
        json!({
            "workflow": wf.name,
            "tasks": wf.tasks.len(),
            "offered_slots": p.slots(),
            "offer": source,
            "offered": p.offer.slots.iter().map(|sl| json!({
                "id": sl.id, "resource": sl.resource, "start_s": sl.start_s, "end_s": sl.end_s,
                "processors": sl.processors, "price": sl.price,
            })).collect::<Vec<_>>(),
            "alpha": alpha,
            "evaluations": out.evaluations,
            "feasible": out.feasible,
            "planning_ms": took.as_millis() as u64,
            "best_effort_su": wf.work_s() as f64 / 3600.0,
            "pareto": out.front.iter().map(|q| plan_json(p, q)).collect::<Vec<_>>(),
            "chosen": {
                "index": pick,
                "cost_su": chosen.cost,
                "makespan_s": chosen.makespan_s,
                "slots": chosen.slots.iter().map(|&i| {
                    let sl = &p.offer.slots[i];
                    json!({"id": sl.id, "resource": sl.resource, "start_s": sl.start_s, "end_s": sl.end_s,
                           "processors": sl.processors, "cost_su": sl.cost()})
                }).collect::<Vec<_>>(),
                "schedule": s.placements.iter().enumerate().map(|(t, pl)| json!({
                    "task": wf.tasks[t].id, "start_s": pl.start_s, "end_s": pl.end_s,
                    "parts": pl.parts.iter().map(|&(i, n)| json!({"slot": p.offer.slots[i].id, "processors": n})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            },
            "reservations": held.iter().map(|r| json!({
                "id": r.id, "resource": r.resource, "cpus": r.cpus, "start_s": r.start_s, "end_s": r.end_s,
            })).collect::<Vec<_>>(),
        })
    }

    fn print(&self) {
        let (p, out, s, pick) = (self.p, self.out, self.s, self.pick);
        let wf = &p.workflow;
        println!(
            "workflow {:?}: {} tasks, {} edges; best-effort cost {:.2} SU",
            wf.name,
            wf.tasks.len(),
            wf.edges.len(),
            wf.work_s() as f64 / 3600.0
        );
        println!(
            "{} slots offered ({}); MOGA evaluated {} plans ({} feasible) in {} ms; Pareto set of {}:",
            p.slots(),
            self.source,
            out.evaluations,
            out.feasible,
            self.took.as_millis(),
            out.front.len()
        );
        println!(
            "   {:>4} {:>12} {:>12} {:>6}",
            "#", "cost (SU)", "makespan (s)", "slots"
        );
        for (i, q) in out.front.iter().enumerate() {
            let mark = if i == pick { "*" } else { " " };
            println!(
                "{mark}  {i:>4} {:>12.3} {:>12} {:>6}",
                q.cost,
                q.makespan_s,
                q.slots.len()
            );
        }
        let chosen = &out.front[pick];
        println!(
            "chosen with alpha {}: #{pick}, cost {:.3} SU, makespan {} s, slots:",
            self.alpha, chosen.cost, s.makespan_s
        );
        for &i in &chosen.slots {
            let sl = &p.offer.slots[i];
            let used = s
                .placements
                .iter()
                .filter(|pl| pl.parts.iter().any(|&(x, _)| x == i))
                .count();
            println!(
                "  {:<24} {:<16} {} .. {} ({} s) processors {:<5} {:.3} SU, {used} tasks",
                sl.id,
                sl.resource,
                sl.start_s,
                sl.end_s,
                sl.end_s - sl.start_s,
                sl.processors,
                sl.cost()
            );
        }
        for r in self.held {
            println!(
                "reserved {} on {}: {} cpus {} .. {}",
                r.id, r.resource, r.cpus, r.start_s, r.end_s
            );
        }
    }
}
