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
    /// Log filter: a level and levels per target, e.g. "info" or "warn,gma_producer=debug".
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
    /// Steer a running producer's sensors: list them with their cost, set a period, enable,
    /// disable, add or remove a process watch (policy action producer.control; docs/control.md).
    Agent {
        #[command(subcommand)]
        command: crate::agentctl::AgentCommand,
    },
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
    /// The grid of federation endpoints: `query` resources through the hierarchy, `reserve`,
    /// `start`, `release` and `list` reservations at the endpoint that manages a host.
    Grid(crate::grid::GridArgs),
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
    /// The endpoint flags of a role command; `None` for a client command (it serves nothing)
    /// and for `demo` (its roles run with their defaults on loopback).
    pub fn endpoint(&self) -> Option<&crate::args::EndpointArgs> {
        use Command::*;
        match self {
            Directory(a) => Some(&a.endpoint),
            AppSim(a) => Some(&a.endpoint),
            Producer(a) => Some(&a.role.endpoint),
            Rescheduler(a) => Some(&a.role.endpoint),
            Monitor(a) => Some(&a.role.endpoint),
            Sink(a) => Some(&a.role.endpoint),
            Archiver(a) => Some(&a.role.endpoint),
            Relay(a) => Some(&a.role.endpoint),
            Broker(a) => Some(&a.role.endpoint),
            Simres(a) => Some(&a.role.endpoint),
            Slurm(a) => Some(&a.role.endpoint),
            Dashboard(a) => Some(&a.role.endpoint),
            Netprobe(a) => Some(&a.role.endpoint),
            Federation(a) => Some(&a.role.endpoint),
            Demo(_)
            | Search(_)
            | Subscribe(_)
            | Query(_)
            | Emit(_)
            | Sim { .. }
            | Agent { .. }
            | Cluster(_)
            | Bench(_)
            | Archive(_)
            | Certs(_)
            | Job(_)
            | Grid(_)
            | Net(_)
            | Doors(_) => None,
        }
    }

    /// True for the commands that serve until SIGTERM or Ctrl-C and then drain (every role but
    /// app-sim, which ends by itself, and the demo).
    pub fn drains(&self) -> bool {
        matches!(self, Command::Demo(_)) || (self.endpoint().is_some() && !matches!(self, Command::AppSim(_)))
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::args::{CLIENT_HEADING, GLOBAL_HEADING, SERVING_HEADING};

    /// The flags of a served endpoint ([`crate::args::EndpointArgs`]).
    const SERVER_FLAGS: [&str; 6] = [
        "--tls-client-ca",
        "--allow-plaintext",
        "--access-policy",
        "--metrics-listen",
        "--metrics-insecure",
        "--rpc-events-ms",
    ];
    /// The flags about the `gma` process itself.
    const GLOBAL_FLAGS: [&str; 1] = ["--log"];
    /// The TLS flags every command takes.
    const CLIENT_FLAGS: [&str; 3] = ["--tls-ca", "--tls-cert", "--tls-key"];
    /// The subcommands that serve an endpoint (Command::endpoint is Some for them).
    const ROLES: [&str; 14] = [
        "directory",
        "producer",
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
    /// The roles that listen and register in a directory ([`crate::args::RoleArgs`]).
    const DIRECTORY_ROLES: [&str; 12] = [
        "producer",
        "rescheduler",
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

    /// The flags (`--x`) listed in `lines`, in order.
    fn flags<'a>(lines: &[&'a str]) -> Vec<&'a str> {
        lines
            .iter()
            .flat_map(|l| l.split_whitespace().take(2))
            .map(|w| w.trim_end_matches(','))
            .filter(|w| w.starts_with("--"))
            .collect()
    }

    fn has_flag(lines: &[&str], flag: &str) -> bool {
        flags(lines).contains(&flag)
    }

    /// Every command shows `--log` alone under "Global options" and the TLS flags alone under
    /// their own heading, apart from the command's own flags.
    fn check_global_and_client_headings(name: &str, h: &str) {
        let global = section(h, GLOBAL_HEADING);
        assert_eq!(
            flags(&global),
            GLOBAL_FLAGS,
            "gma {name}: {GLOBAL_HEADING:?}:\n{h}"
        );
        let client = section(h, CLIENT_HEADING);
        assert_eq!(
            flags(&client),
            CLIENT_FLAGS,
            "gma {name}: {CLIENT_HEADING:?}:\n{h}"
        );
        let own = section(h, "Options");
        for f in GLOBAL_FLAGS.iter().chain(&CLIENT_FLAGS) {
            assert!(
                !has_flag(&own, f),
                "gma {name}: {f} is interleaved with the command's own flags:\n{h}"
            );
        }
    }

    #[test]
    fn gma_help_shows_the_global_options_apart_from_the_tls_flags() {
        let h = help(&[]);
        check_global_and_client_headings("--help", &h);
        let global_at = h.find(&format!("{GLOBAL_HEADING}:")).expect("global heading");
        let client_at = h.find(&format!("{CLIENT_HEADING}:")).expect("client heading");
        assert_ne!(global_at, client_at);
        for f in SERVER_FLAGS {
            assert!(!h.contains(f), "gma --help shows {f}:\n{h}");
        }
    }

    #[test]
    fn a_client_command_shows_only_client_flags_under_their_heading() {
        let h = help(&["net", "matrix"]);
        for f in SERVER_FLAGS {
            assert!(!h.contains(f), "gma net matrix --help shows {f}:\n{h}");
        }
        assert!(!h.contains(SERVING_HEADING), "{h}");
        let own = section(&h, "Options");
        assert!(has_flag(&own, "--directory"), "{h}");
        check_global_and_client_headings("net matrix", &h);
    }

    #[test]
    fn every_client_command_lacks_the_server_flags_and_every_role_has_them_under_their_heading() {
        let cmd = Cli::command();
        let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
        for r in ROLES {
            assert!(names.iter().any(|n| n == r), "no role command {r}");
        }
        for name in names.iter().filter(|n| *n != "help") {
            let h = help(&[name]);
            if ROLES.contains(&name.as_str()) {
                let serving = flags(&section(&h, SERVING_HEADING));
                let own = section(&h, "Options");
                let mut shared: Vec<&str> = vec!["--listen"];
                if DIRECTORY_ROLES.contains(&name.as_str()) {
                    shared.push("--directory");
                }
                shared.extend(SERVER_FLAGS);
                for f in &shared {
                    assert!(
                        serving.contains(f),
                        "gma {name}: {f} not under {SERVING_HEADING:?}:\n{h}"
                    );
                    assert!(
                        !has_flag(&own, f),
                        "gma {name}: {f} among the command's own flags:\n{h}"
                    );
                }
                assert_eq!(serving.len(), shared.len(), "gma {name}: {serving:?}:\n{h}");
            } else {
                for f in SERVER_FLAGS {
                    assert!(!h.contains(f), "client command gma {name} shows {f}:\n{h}");
                }
                assert!(!h.contains(SERVING_HEADING), "client command gma {name}:\n{h}");
            }
            check_global_and_client_headings(name, &h);
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
        let server = cli.command.endpoint().expect("producer is a role");
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
        assert!(cli.command.endpoint().is_none());
        assert_eq!(cli.tls.tls_ca, Some("ca.pem".into()));
    }

    /// The shared flags land on the role's config, over what its file said, the same way for
    /// every role (one declaration, one apply).
    #[test]
    fn the_shared_flags_override_the_config_of_every_role() {
        let shared = [
            "--listen",
            "127.0.0.1:9",
            "--directory",
            "127.0.0.1:8",
            "--metrics-listen",
            "127.0.0.1:7",
            "--rpc-events-ms",
            "250",
        ];
        for role in DIRECTORY_ROLES {
            let mut argv = vec!["gma", role];
            argv.extend(shared);
            let required: &[&str] = match role {
                "monitor" | "relay" => &["--config", "x.toml"],
                "sink" => &["--accept", "*"],
                _ => &[],
            };
            argv.extend(required);
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("gma {role}: {e}"));
            let e = cli.command.endpoint().expect("a role");
            assert_eq!(e.metrics_listen.as_deref(), Some("127.0.0.1:7"), "{role}");
            assert_eq!(e.rpc_events_ms, Some(250), "{role}");
        }
        let cli = Cli::try_parse_from(
            ["gma", "producer", "--config", "p.toml"]
                .into_iter()
                .chain(shared),
        )
        .expect("producer flags");
        let Command::Producer(a) = cli.command else {
            panic!("not a producer")
        };
        let mut cfg = gma_producer::ProducerConfig {
            listen: "127.0.0.1:1".into(),
            registration: gma_core::registration::Registration::new(Some("file:1".into())),
            ..Default::default()
        };
        cfg.endpoint.rpc_events_ms = Some(5);
        a.role
            .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)
            .expect("apply");
        assert_eq!(cfg.listen, "127.0.0.1:9");
        assert_eq!(cfg.registration.directory.as_deref(), Some("127.0.0.1:8"));
        assert_eq!(cfg.endpoint.metrics_listen.as_deref(), Some("127.0.0.1:7"));
        assert_eq!(cfg.endpoint.rpc_events_ms, Some(250));

        // Without the flags the file's values stay.
        let cli = Cli::try_parse_from(["gma", "monitor", "--config", "m.toml"]).expect("monitor");
        let Command::Monitor(a) = cli.command else {
            panic!("not a monitor")
        };
        let (mut listen, mut directory) = (Some("127.0.0.1:3".to_string()), Some("d:4".to_string()));
        let mut endpoint = gma_core::endpoint::Endpoint {
            rpc_events_ms: Some(6),
            ..Default::default()
        };
        a.role
            .apply(&mut listen, &mut directory, &mut endpoint)
            .expect("apply");
        assert_eq!(listen.as_deref(), Some("127.0.0.1:3"));
        assert_eq!(directory.as_deref(), Some("d:4"));
        assert_eq!(endpoint.rpc_events_ms, Some(6));
    }

    /// `--config` is one of the shared role flags, listed with the command's own; the sink has
    /// no config file, so it does not show it.
    #[test]
    fn every_role_but_the_sink_shows_config_among_its_own_flags() {
        for role in DIRECTORY_ROLES {
            let h = help(&[role]);
            let own = section(&h, "Options");
            assert_eq!(has_flag(&own, "--config"), role != "sink", "gma {role}:\n{h}");
        }
        for role in ["monitor", "relay"] {
            let err = Cli::try_parse_from(["gma", role]).expect_err("--config is required");
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{role}"
            );
        }
    }

    #[tokio::test]
    async fn the_sink_refuses_a_config_file() {
        let cli =
            Cli::try_parse_from(["gma", "sink", "--accept", "*", "--config", "s.toml"]).expect("parses");
        let Command::Sink(a) = cli.command else {
            panic!("not a sink")
        };
        let err = crate::sink::run(a).await.expect_err("no config file").to_string();
        assert!(err.contains("the sink has no config file"), "{err}");
    }

    #[test]
    fn roles_without_rpc_events_refuse_the_flag() {
        for argv in [
            vec!["gma", "dashboard", "--rpc-events-ms", "5"],
            vec!["gma", "sink", "--accept", "*", "--rpc-events-ms", "5"],
            vec![
                "gma",
                "app-sim",
                "--host",
                "h",
                "--producer",
                "p:1",
                "--rpc-events-ms",
                "5",
            ],
        ] {
            let cli = Cli::try_parse_from(&argv).expect("parses");
            let e = cli.command.endpoint().expect("a role");
            let err = e.refuse_rpc_events("it").unwrap_err().to_string();
            assert!(err.contains("--rpc-events-ms"), "{argv:?}: {err}");
        }
    }
}
