//! Writes the seed corpora of the fuzz targets into `fuzz/corpus/<target>/` (or the directory
//! given as the first argument): filter expressions and patterns from the unit tests, the
//! example TOML files under `config/` plus one config per role, encoded `EventBatch`es made
//! with the real `BatchEncoder`, wire events with schemas, and small `/proc` samples.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml -p gen-seeds` — deterministic; rerun after a
//! format change. Files are named `seed-*` so they are told apart from what fuzzing adds.

use std::fs;
use std::path::{Path, PathBuf};

use gma_core::codec::{BatchEncoder, Mark, SeriesInfo};
use gma_core::event::{dbl, field, text, to_wire};
use gma_proto::v1::{self as pb, FieldType};
use prost::Message;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    fs::create_dir_all(&d).expect("create corpus dir");
    fs::write(d.join(format!("seed-{name}")), bytes).expect("write seed");
}

const FILTERS: &[&str] = &[
    "a > 1 AND b > 1 Or c > 1",
    "a<=1 and b!=1 and c==0",
    "a = 1",
    "\ta\n>\r\n1 ",
    "1 < a",
    "3 != a",
    "a > -1.5e2",
    "a == 2E+3 or a == 125e-3 or a == 007.50 or a == -0",
    r#"kind == "exit" and status != 0"#,
    "'exit' != kind",
    r#"cmd == "a\"b'c\\d\n\t" or cmd == 'it\'s'"#,
    "cmd == 'héllo ✓'",
    "a > b",
    "kind != cmd",
    "host.*.user > 50",
    "host.cpu.system >= 5",
    "h?st.c*.user > 1 and *.system > 1",
    "user > 1",
    "host.cpu.user > 1 or kind == 'x'",
    "not (a > 1 or b > 1)",
    "!(a > 1) && (b < 2 || c >= 3)",
    "a > 1 or not (zz > 1 and yy == 'q')",
    "c > 1 or kind == 'x'",
    r#"watch == "web" and kind == "abnormal_exit""#,
    "free_cpus == 0",
    "n > m and x == y or u != 0",
    "((((a > 1))))",
    // Errors the parser must report well.
    "a > 1e999",
    "host..cpu.user > 1",
    "a > 1 | b > 1",
    "kind > 'x'",
];

const PATTERNS: &[&str] = &[
    "host.*\n*.cpu\nhost.cpu",
    "*\nhost.cpu\nhost.cpu",
    "host.cpu\nhost.cpu\nhost.cpu",
    "h?st.c*\n*.system\nhost.cpu",
    "*.avg1m\nhost.load.avg1m\nhost.load.avg1m",
    "sim-*\nhostA/*\nhostA/eth0",
    "hostA\nhost?\nhostB",
    "a*b*c\n*b*\naXbYc",
    "host..cpu\n.x\n",
    "**?*\n?*?\nabc",
];

fn configs(dir: &Path, repo: &Path) {
    let examples = repo.join("config");
    if let Ok(entries) = fs::read_dir(&examples) {
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("x.toml");
            write(dir, "config", name, &fs::read(p).expect("read example config"));
        }
    }
    let inline: &[(&str, &str)] = &[
        (
            "producer.toml",
            r#"listen = "127.0.0.1:7001"
directory = "127.0.0.1:7000"
source = "hostA"
period_ms = 1000
sensor_period_ms = { "host.disk" = 5000, sim = 500 }
summaries = ["host.load", "host.cpu"]
forecasts = ["host.load"]
host_sensors = false
simulate = "config/demo-sim.toml"

[[process]]
name = "web"
command = ["/usr/sbin/nginx", "-g", "daemon off;"]
restart = true
rss_mb_max = 512

[[process]]
name = "db"
comm = "postgres"
cpu_pct_max = 90
"#,
        ),
        (
            "sim-generate.toml",
            r#"period_ms = 500

[[host]]
name = "hostC"
cpus = 4
memory_mb = 8192
free_cpus = 1.5
queue_waiting = 2
arch = "aarch64"
os = "Linux"

[[generate]]
count = 3
prefix = "node"
seed = 7
cpus = 2
memory_mb = 4096
walk = { min = 0.0, max = 2.0, step = 0.25 }
benchmarks = { specint = 1000 }
"#,
        ),
        (
            "directory.toml",
            r#"data_dir = "/var/lib/gma/directory"
default_ttl_ms = 10000
min_ttl_ms = 1000
max_ttl_ms = 60000
node_id = 1
peers = "1=127.0.0.1:7000,2=http://127.0.0.1:7010, 3=[::1]:7020"
init = true
heartbeat_ms = 100
election_min_ms = 300
election_max_ms = 600
"#,
        ),
        (
            "rescheduler.toml",
            r#"listen = "127.0.0.1:7005"
directory = "127.0.0.1:7000"
source = "rescheduler"
cost_s = 900.0
threshold = 0.3
max_age_ms = 5000
opportunistic = true
reference_specint = 2000.0
lease_ttl_ms = 10000
"#,
        ),
    ];
    for (name, text) in inline {
        write(dir, "config", name, text.as_bytes());
    }
}

fn schema(name: &str, fields: Vec<pb::FieldSpec>) -> pb::EventSchema {
    pb::EventSchema {
        name: name.to_string(),
        version: 1,
        fields,
        description: String::new(),
    }
}

/// Length-delimited batches, as the batch target's stream mode reads them.
fn stream(batches: &[pb::EventBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in batches {
        b.encode_length_delimited(&mut out).expect("encode into a Vec");
    }
    out
}

fn batches(dir: &Path) {
    let cpu = schema(
        "host.cpu",
        vec![dbl("user", "%", ""), dbl("system", "%", ""), text("label", "")],
    );
    let net = schema(
        "host.net",
        vec![text("iface", ""), dbl("rx", "B/s", ""), dbl("tx", "B/s", "")],
    );
    let s1 = SeriesInfo::new(1, "host.cpu", "hostA", &cpu);
    let s2 = SeriesInfo::new(2, "host.net", "hostA/eth0", &net);
    let s3 = SeriesInfo::new(7, "host.cpu", "hostB", &cpu);
    let t0 = 1_700_000_000_000_000_000i64;

    let mut e = BatchEncoder::new();
    e.push(&s1, 1, t0, &[12.5, 3.0], &["all".into()]);
    e.push(&s2, 2, t0 + 10, &[1000.0, f64::NAN], &["eth0".into()]);
    e.push(&s1, 5, t0 + 1_000_000_000, &[99.0, 0.0], &["é\"\n".into()]);
    let b1 = e.finish(42);
    write(dir, "batch", "single.pb", &b1.encode_to_vec());

    e.push_marked(
        &s3,
        6,
        t0 + 2_000_000_000,
        &[50.0, 1.0],
        &[String::new()],
        Mark::Enter,
    );
    e.push(&s1, 7, t0 - 5, &[f64::INFINITY, -0.0], &["x".into()]);
    e.push_marked(
        &s3,
        9,
        t0 + 3_000_000_000,
        &[1.0, 1.0],
        &["y".into()],
        Mark::Leave,
    );
    e.gap(8, 8, 1, "buffer window exceeded");
    e.conflated(3);
    let b2 = e.finish(42);
    write(dir, "batch", "marks-gap.pb", &b2.encode_to_vec());

    let empty = e.finish(42);
    write(
        dir,
        "batch",
        "stream3.pb",
        &stream(&[b1.clone(), b2.clone(), empty]),
    );

    // A shared encoder's batch refers to series declared in an earlier batch.
    let mut shared = BatchEncoder::shared();
    shared.push(&s2, 20, t0, &[1.0, 2.0], &["lo".into()]);
    let b3 = shared.finish(43);
    write(dir, "batch", "undeclared.pb", &b3.encode_to_vec());
    write(dir, "batch", "stream-shared.pb", &stream(&[b1, b3]));
}

fn events(dir: &Path) {
    // Layout: u16 LE length of the Event, the Event, then an EventSchema.
    let framed = |e: &pb::Event, s: Option<&pb::EventSchema>| {
        let ev = e.encode_to_vec();
        let mut out = (ev.len() as u16).to_le_bytes().to_vec();
        out.extend_from_slice(&ev);
        if let Some(s) = s {
            out.extend_from_slice(&s.encode_to_vec());
        }
        out
    };
    let t0 = 1_700_000_000_000_000_000i64;
    let cpu_fields = vec![dbl("user", "%", ""), dbl("system", "%", ""), text("label", "")];
    let cpu = schema("host.cpu", cpu_fields.clone());
    let e = to_wire(
        "host.cpu",
        "hostA",
        t0,
        1,
        &cpu_fields,
        &[12.5, 3.0],
        &["all".into()],
    );
    write(dir, "event", "host-cpu.bin", &framed(&e, Some(&cpu)));

    let abc = vec![dbl("a", "", ""), dbl("b", "", ""), dbl("c", "", "")];
    let e = to_wire("t", "s", -1, 2, &abc, &[1.0, f64::NAN, -0.0], &[]);
    write(dir, "event", "t.bin", &framed(&e, None));

    let proc_fields = vec![
        text("watch", ""),
        text("kind", ""),
        dbl("status", "", ""),
        text("cmd", ""),
    ];
    let proc_schema = schema("proc.event", proc_fields.clone());
    let e = to_wire(
        "proc.event",
        "hostA",
        t0,
        3,
        &proc_fields,
        &[1.0],
        &[
            "web".into(),
            "abnormal_exit".into(),
            "nginx -g \"daemon off;\"".into(),
        ],
    );
    write(dir, "event", "proc-event.bin", &framed(&e, Some(&proc_schema)));

    let odd = schema(
        "app.x-y_z.v2",
        vec![
            text("x", "u"),
            dbl("n", "", "d"),
            field("u", FieldType::Unspecified, "", ""),
        ],
    );
    let e = to_wire(
        "app.x-y_z.v2",
        "a/b:c",
        0,
        u64::MAX,
        &odd.fields,
        &[1.0, 2.0],
        &["é".into()],
    );
    write(dir, "event", "odd-schema.bin", &framed(&e, Some(&odd)));
}

const PROCFS: &[(&str, &str)] = &[
    (
        "stat",
        "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0\ncpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0\ncpu1 1335030 26758 553998 13409617 4296 0 1316 0 0 0\nintr 1 2 3\nctxt 1990473\nbtime 1062191376\nprocesses 2915\nprocs_running 1\nprocs_blocked 0\n",
    ),
    ("loadavg", "0.20 0.18 0.12 1/80 11206\n"),
    (
        "meminfo",
        "MemTotal:       16384000 kB\nMemFree:         8192000 kB\nMemAvailable:   12000000 kB\nBuffers:          100000 kB\nCached:          2000000 kB\nSwapTotal:       2097148 kB\nSwapFree:        2097148 kB\n",
    ),
    (
        "net-dev",
        "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 1234 10 0 0 0 0 0 0 1234 10 0 0 0 0 0 0\n  eth0: 987654 1000 1 2 0 0 0 5 123456 900 0 0 0 0 0 0\n",
    ),
    (
        "diskstats",
        "   8       0 sda 1000 10 20000 300 2000 20 40000 600 0 900 1000 0 0 0 0 0 0\n   8       1 sda1 900 9 18000 250 1900 19 38000 550 0 850 900\n 259       0 nvme0n1 5 0 40 1 0 0 0 0 0 1 1\n",
    ),
    (
        "snmp",
        "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\nTcp: 1 200 120000 -1 100 50 2 3 4 10000 9000 7 0 5 0\nUdp: InDatagrams\nUdp: 1\n",
    ),
    (
        "pid-stat",
        "1234 (my (odd) proc) S 1 1234 1234 0 -1 4194560 100 0 0 0 25 10 0 0 20 0 1 0 12345 10000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n",
    ),
    ("statm", "2500 500 300 10 0 400 0\n"),
    (
        "status",
        "Name:\tgma\nState:\tS (sleeping)\nVmPeak:\t  20000 kB\nVmRSS:\t    5120 kB\nThreads:\t4\n",
    ),
    ("os-release", "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n"),
];

fn main() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("fuzz/corpus"));
    for (i, f) in FILTERS.iter().enumerate() {
        write(&dir, "filter", &format!("{i:02}.txt"), f.as_bytes());
    }
    // Filters followed by value bytes (after a NUL): picks from the value tables.
    write(
        &dir,
        "filter",
        "values-1.bin",
        b"a > 1 and kind == 'exit'\0\x07\x0c\x01\x02\x03",
    );
    write(
        &dir,
        "filter",
        "values-2.bin",
        b"n > m or x != y\0\xff\x00\x00\x00\x00\x00\x00\xf0\x7f\x05\x0ahello",
    );
    for (i, p) in PATTERNS.iter().enumerate() {
        write(&dir, "pattern", &format!("{i:02}.txt"), p.as_bytes());
    }
    configs(&dir, &repo);
    batches(&dir);
    events(&dir);
    for (name, text) in PROCFS {
        write(&dir, "procfs", name, text.as_bytes());
    }
    // /proc/self/auxv: AT_CLKTCK (17) = 100, then AT_NULL.
    let w = std::mem::size_of::<usize>();
    let mut auxv = Vec::new();
    for v in [6usize, 4096, 17, 100, 0, 0] {
        auxv.extend_from_slice(&v.to_ne_bytes()[..w]);
    }
    write(&dir, "procfs", "auxv", &auxv);
    println!("seeds written under {}", dir.display());
}
