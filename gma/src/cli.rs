//! The `gma` command line (clap): [`Cli`] and the [`Command`] enum of every subcommand. Each
//! subcommand's arguments live in its own module; shared flags in [`crate::args`].

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "gma",
    // The same usage lines whatever the executable is called (the tests run it as gma-e2e).
    bin_name = "gma",
    version,
    about = "GMA fabric: grid monitoring producers, consumers and a replicated directory"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "gma_producer=debug".
    #[arg(long, global = true, env = "GMA_LOG", default_value = "warn", help_heading = crate::args::GLOBAL_HEADING)]
    pub log: String,
    #[command(flatten)]
    pub tls: crate::args::ClientTlsArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a directory node (single node; metadata only, leases, watch).
    Directory(crate::roles::DirectoryArgs),
    /// Run a producer: host sensors and/or simulated hosts, served to consumers.
    Producer(crate::roles::ProducerArgs),
    /// Search the directory for producers (and consumers) by event pattern.
    Search(crate::tools::SearchArgs),
    /// Subscribe to every producer of a pattern and print events as they arrive.
    Subscribe(crate::tools::SubscribeArgs),
    /// Ask producers for their latest cached events.
    Query(crate::tools::QueryArgs),
    /// Push application events into a producer (fields by name; the schema is inferred when
    /// the producer has none), from the arguments or from standard input.
    Emit(crate::emit::EmitArgs),
    /// Control simulated hosts of a running producer.
    Sim {
        #[command(subcommand)]
        command: crate::tools::SimCommand,
    },
    /// The job-migration rescheduler (a consumer of contract and load streams), or
    /// `gma rescheduler evaluate` for the pure decision rule.
    Rescheduler(crate::resched::ReschedulerArgs),
    /// A sample application that reports phases to a contract monitor and obeys stop/resume.
    AppSim(crate::appsim::AppSimArgs),
    /// Inspect and change the membership of a replicated directory.
    Cluster(crate::cluster::ClusterArgs),
    /// Everything on this machine: directory, host producer, simulated hosts, rescheduler;
    /// until Ctrl-C.
    Demo(crate::roles::DemoArgs),
    /// Benchmarks that print figures (throughput, latency percentiles, agent cost).
    Bench(gma_bench::BenchArgs),
    /// Action monitor: run rules over event streams and run a command when one holds
    /// (restart a dead process, page when every listed host is down); see docs/monitor.md.
    Monitor(crate::monitor::MonitorArgs),
    /// A consumer that accepts streams pushed by producers (registered in the directory) and
    /// prints them as JSON lines.
    Sink(crate::sink::SinkArgs),
    /// Run an archiver: durable, compressed history of the events it subscribes to.
    Archiver(crate::archive::ArchiverArgs),
    /// Query an archiver: query, series, export, stats.
    Archive(crate::archive::ArchiveArgs),
    /// Relay: subscribe to a site's producers, publish a site.load summary and republish
    /// chosen events under one record (a compound consumer/producer).
    Relay(crate::relay::RelayArgs),
    /// Development certificates: a CA and node/user certificates (rcgen).
    Certs(crate::certs::CertsArgs),
    /// The resource broker (ranks resources for jobs from the live load streams, coallocates
    /// with advance reservations), or `select` / `coallocate` / `view` against a running one.
    Broker(crate::broker::BrokerArgs),
    /// The federation endpoint of a site (summaries to linked sites, jobs placed locally or
    /// forwarded with route()), or `add` / `remove` / `status` of its links.
    Federation(crate::federation::FederationArgs),
    /// Jobs at a site's federation endpoint (submit, status, list, cancel), or run by a
    /// broker in a batch system's reservation (`submit --broker`).
    Job(crate::federation::JobArgs),
    /// A simulated resource manager: per-resource reservation calendars behind the
    /// Reservations interface (create / modify / release with granted / never / retry-from).
    Simres(crate::broker::SimresArgs),
    /// The Slurm adapter: the Reservations interface over a real Slurm controller (advance
    /// reservations with scontrol, jobs started in them with sbatch; docs/slurm.md).
    Slurm(crate::slurm::SlurmArgs),
    /// The live web dashboard: producers and consumers, per-host charts, cluster, decisions,
    /// gma.rpc, archived history (a real-time consumer; docs/dashboard.md).
    Dashboard(crate::dashboard::DashboardArgs),
    /// The network sensor: latency and bandwidth probes to the other netprobes of its site,
    /// one at a time (a token circulates), published as net.rtt / net.bw with forecasts.
    Netprobe(crate::netprobe::NetprobeArgs),
    /// Read the network sensors: `matrix` (every pair, with forecasts), `status` (the cliques).
    Net(crate::netprobe::NetArgs),
    /// Every door of every role (each RPC and HTTP route), who may knock, the actions the
    /// policy is asked and what a summary-only identity gets (docs/security.md).
    Doors(crate::doors::DoorsArgs),
}

impl Command {
    /// The serving flags of a role command; `None` for a client command (it serves nothing).
    pub fn server(&self) -> Option<&crate::args::ServerArgs> {
        use Command::*;
        match self {
            Directory(a) => Some(&a.server),
            Producer(a) => Some(&a.server),
            Demo(a) => Some(&a.server),
            Rescheduler(a) => Some(&a.server),
            AppSim(a) => Some(&a.server),
            Monitor(a) => Some(&a.server),
            Sink(a) => Some(&a.server),
            Archiver(a) => Some(&a.server),
            Relay(a) => Some(&a.server),
            Broker(a) => Some(&a.server),
            Simres(a) => Some(&a.server),
            Slurm(a) => Some(&a.server),
            Dashboard(a) => Some(&a.server),
            Netprobe(a) => Some(&a.server),
            Federation(a) => Some(&a.server),
            Search(_)
            | Subscribe(_)
            | Query(_)
            | Emit(_)
            | Sim { .. }
            | Cluster(_)
            | Bench(_)
            | Archive(_)
            | Certs(_)
            | Job(_)
            | Net(_)
            | Doors(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::args::{GLOBAL_HEADING, SERVING_HEADING};

    const SERVER_FLAGS: [&str; 4] = [
        "--tls-client-ca",
        "--allow-plaintext",
        "--access-policy",
        "--metrics-insecure",
    ];
    const CLIENT_FLAGS: [&str; 4] = ["--log", "--tls-ca", "--tls-cert", "--tls-key"];
    /// The subcommands that serve an endpoint (Command::server is Some for them).
    const ROLES: [&str; 15] = [
        "directory",
        "producer",
        "demo",
        "rescheduler",
        "app-sim",
        "monitor",
        "sink",
        "archiver",
        "relay",
        "broker",
        "simres",
        "slurm",
        "dashboard",
        "netprobe",
        "federation",
    ];

    /// The help of `gma <path...>` as clap renders it.
    fn help(path: &[&str]) -> String {
        let mut cmd = Cli::command();
        cmd.build();
        let mut c = &mut cmd;
        for p in path {
            c = c
                .find_subcommand_mut(p)
                .unwrap_or_else(|| panic!("no subcommand {p}"));
        }
        c.render_help().to_string()
    }

    /// The lines under `heading:` up to the next blank line.
    fn section<'a>(help: &'a str, heading: &str) -> Vec<&'a str> {
        help.lines()
            .skip_while(|l| *l != format!("{heading}:"))
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .collect()
    }

    fn has_flag(lines: &[&str], flag: &str) -> bool {
        lines
            .iter()
            .any(|l| l.split_whitespace().any(|w| w == flag || w == format!("{flag},")))
    }

    #[test]
    fn a_client_command_shows_only_client_flags_under_their_heading() {
        let h = help(&["net", "matrix"]);
        for f in SERVER_FLAGS {
            assert!(!h.contains(f), "gma net matrix --help shows {f}:\n{h}");
        }
        let own = section(&h, "Options");
        assert!(has_flag(&own, "--directory"), "{h}");
        let global = section(&h, GLOBAL_HEADING);
        for f in CLIENT_FLAGS {
            assert!(has_flag(&global, f), "{f} is not under {GLOBAL_HEADING:?}:\n{h}");
            assert!(
                !has_flag(&own, f),
                "{f} is interleaved with the command's own flags:\n{h}"
            );
        }
    }

    #[test]
    fn every_client_command_lacks_the_server_flags_and_every_role_has_them_under_their_heading() {
        let cmd = Cli::command();
        let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
        for r in ROLES {
            assert!(names.iter().any(|n| n == r), "no role command {r}");
        }
        for name in &names {
            let h = help(&[name]);
            if ROLES.contains(&name.as_str()) {
                let serving = section(&h, SERVING_HEADING);
                let own = section(&h, "Options");
                for f in SERVER_FLAGS {
                    assert!(
                        has_flag(&serving, f),
                        "gma {name}: {f} not under {SERVING_HEADING:?}:\n{h}"
                    );
                    assert!(
                        !has_flag(&own, f),
                        "gma {name}: {f} among the command's own flags:\n{h}"
                    );
                }
            } else {
                for f in SERVER_FLAGS {
                    assert!(!h.contains(f), "client command gma {name} shows {f}:\n{h}");
                }
            }
            let global = section(&h, GLOBAL_HEADING);
            for f in CLIENT_FLAGS {
                assert!(
                    has_flag(&global, f),
                    "gma {name}: {f} not under {GLOBAL_HEADING:?}:\n{h}"
                );
            }
        }
    }

    #[test]
    fn the_server_flags_of_a_role_reach_its_settings_and_a_client_command_has_none() {
        let cli = Cli::try_parse_from([
            "gma",
            "producer",
            "--tls-ca",
            "ca.pem",
            "--tls-client-ca",
            "ca.pem",
            "--access-policy",
            "p.toml",
            "--allow-plaintext",
        ])
        .expect("a role takes the server flags");
        let server = cli.command.server().expect("producer is a role");
        assert_eq!(server.access_policy, Some("p.toml".into()));
        let tls = cli.tls.server(server).expect("TLS flags were given");
        assert_eq!(tls.client_ca, Some("ca.pem".into()));
        assert!(tls.allow_plaintext);

        let err = Cli::try_parse_from([
            "gma",
            "net",
            "matrix",
            "--directory",
            "d:1",
            "--access-policy",
            "p.toml",
        ])
        .expect_err("a client command refuses a server flag");
        assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
        let cli = Cli::try_parse_from(["gma", "--tls-ca", "ca.pem", "net", "matrix", "--directory", "d:1"])
            .expect("the client flags go anywhere");
        assert!(cli.command.server().is_none());
        assert_eq!(cli.tls.tls_ca, Some("ca.pem".into()));
    }
}
