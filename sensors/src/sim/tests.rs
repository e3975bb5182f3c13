use super::*;
use gma_core::event::Layout;

const EXAMPLE: &str = include_str!("../../config/sim-example.toml");

fn sample(sensor: &mut Box<dyn Sensor>, now_ns: i64) -> Vec<EventData> {
    let mut out = Vec::new();
    sensor.sample(now_ns, &mut out).unwrap();
    out
}

fn values(handle: &SimHandle, host: &str) -> HashMap<&'static str, f64> {
    handle.get(host).unwrap().into_iter().collect()
}

fn config_err(text: &str) -> String {
    let e = SimConfig::from_toml(text).unwrap_err();
    assert!(matches!(e, SensorError::Config { .. }), "{e}");
    e.to_string()
}

#[test]
fn example_file_parses() {
    let cfg = SimConfig::from_toml(EXAMPLE).unwrap();
    assert_eq!(cfg.period_ms, 1000);
    assert_eq!(cfg.host.len(), 2);
    assert_eq!(cfg.host[0].name, "hostA");
    assert_eq!(cfg.host[0].benchmarks.specint, Some(2000.0));
    assert_eq!(cfg.host[1].walk.and_then(|w| w.seed), Some(1));
    assert_eq!(cfg.generate[0].count, 1000);
    let (sensor, handle) = simulation(cfg);
    assert_eq!(handle.hosts().len(), 1002);
    assert_eq!(sensor.name(), "sim");
    assert_eq!(sensor.period(), Duration::from_millis(1000));
}

#[test]
fn load_reads_a_file_and_names_it_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.toml");
    std::fs::write(&path, "[[host]]\nname = \"a\"\ncpus = 1\nmemory_mb = 1\n").unwrap();
    assert_eq!(SimConfig::load(&path).unwrap().host[0].name, "a");
    std::fs::write(&path, "[[host]]\nname = \"a\"\ncpus = 0\nmemory_mb = 1\n").unwrap();
    let e = SimConfig::load(&path).unwrap_err().to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("cpus must be at least 1"),
        "{e}"
    );
    let e = SimConfig::load(&dir.path().join("missing.toml")).unwrap_err();
    assert!(
        matches!(e, SensorError::Io { .. }) && e.to_string().contains("missing.toml"),
        "{e}"
    );
}

#[test]
fn toml_errors_name_the_problem() {
    let e = config_err("[[host]]\nname = \"a\"\ncpus = 1\nmemory_mb = 1\nlode = 2\n");
    assert!(e.contains("lode"), "{e}");
    let e = config_err("perod_ms = 5\n[[host]]\nname = \"a\"\ncpus = 1\nmemory_mb = 1\n");
    assert!(e.contains("perod_ms"), "{e}");
    let e =
        config_err("[[host]]\nname = \"a\"\ncpus = 1\nmemory_mb = 1\nwalk = { min = 0, max = 1, stp = 1 }\n");
    assert!(e.contains("stp"), "{e}");
    let e = config_err("[[host]]\nname = \"a\"\ncpus = 1\nmemory_mb = 1\nbenchmarks = { specjbb = 1 }\n");
    assert!(e.contains("specjbb"), "{e}");
    let e = config_err("[[generate]]\ncount = 2\nprefix = \"g\"\nseed = 1\nzone = \"x\"\n");
    assert!(e.contains("zone"), "{e}");
    let e = config_err("[[host]]\nname = \"a\"\nmemory_mb = 1\n");
    assert!(e.contains("cpus"), "{e}");
}

#[test]
fn validation_rules() {
    let host = |extra: &str| format!("[[host]]\nname = \"a\"\ncpus = 2\nmemory_mb = 1024\n{extra}\n");
    let cases = [
        (String::new(), "declares no hosts"),
        ("period_ms = 0\n".to_string() + &host(""), "period_ms"),
        (host("") + &host(""), "duplicate host name \"a\""),
        (host("load = -1"), "load must be"),
        (host("load = 1\nwalk = { min = 0, max = 1, step = 0.1 }"), "not both"),
        (host("walk = { min = 2, max = 1, step = 0.1 }"), "walk.min (2) must not exceed walk.max (1)"),
        (host("walk = { min = 0, max = 1, step = 0 }"), "walk.step"),
        (host("free_cpus = -2"), "free_cpus"),
        (host("queue_waiting = nan"), "queue_waiting"),
        (host("benchmarks = { specfp = -1 }"), "benchmarks.specfp"),
        (
            "[[host]]\nname = \"a b\"\ncpus = 1\nmemory_mb = 1\n".to_string(),
            "not allowed",
        ),
        ("[[generate]]\ncount = 100001\nprefix = \"g\"\nseed = 1\n".to_string(), "count must be"),
        ("[[generate]]\ncount = 0\nprefix = \"g\"\nseed = 1\n".to_string(), "count must be"),
        ("[[generate]]\ncount = 2\nprefix = \"g h\"\nseed = 1\n".to_string(), "not allowed"),
        ("[[generate]]\ncount = 2\nprefix = \"g\"\nseed = 1\ncpus = 0\n".to_string(), "cpus must be"),
        (
            "[[generate]]\ncount = 2\nprefix = \"g\"\nseed = 1\nwalk = { min = 0, max = 1, step = 1, seed = 3 }\n"
                .to_string(),
            "walk.seed is not allowed",
        ),
        (
            "[[host]]\nname = \"g-0001\"\ncpus = 1\nmemory_mb = 1\n[[generate]]\ncount = 2\nprefix = \"g\"\nseed = 1\n"
                .to_string(),
            "duplicate host name \"g-0001\"",
        ),
        (
            "[[generate]]\ncount = 2\nprefix = \"g\"\nseed = 1\n[[generate]]\ncount = 5\nprefix = \"g\"\nseed = 2\n"
                .to_string(),
            "duplicate host name \"g-0000\"",
        ),
    ];
    for (text, want) in cases {
        let e = config_err(&text);
        assert!(e.contains(want), "{text:?}: {e}");
    }
    // the limit itself is allowed
    let cfg = SimConfig::from_toml("[[generate]]\ncount = 100000\nprefix = \"g\"\nseed = 1\n").unwrap();
    assert_eq!(cfg.generate[0].host_name(99_999), "g-99999");
}

#[test]
fn walk_is_deterministic_and_clamped() {
    let spec = WalkSpec {
        min: 1.0,
        max: 3.0,
        step: 0.5,
        seed: None,
    };
    let run = |seed| {
        let (mut w, mut load) = RandomWalk::new(&spec, seed);
        let mut seq = vec![load];
        for _ in 0..1000 {
            load = w.next(load);
            seq.push(load);
        }
        seq
    };
    let a = run(42);
    assert_eq!(a, run(42));
    assert_ne!(a, run(43));
    assert!(a.iter().all(|&x| (1.0..=3.0).contains(&x)), "left [min, max]");
    assert!(
        a.contains(&1.0) && a.contains(&3.0),
        "a long walk with a big step hits both bounds"
    );
    assert!(a.windows(2).all(|w| (w[1] - w[0]).abs() <= 0.5 + 1e-12));

    let (mut w, start) = RandomWalk::new(
        &WalkSpec {
            min: 2.0,
            max: 2.0,
            ..spec
        },
        1,
    );
    assert_eq!(start, 2.0);
    assert_eq!(w.next(start), 2.0);
}

#[test]
fn simulated_values_follow_the_config() {
    let cfg = SimConfig::from_toml(
        "period_ms = 500\n\
         [[host]]\nname = \"a\"\ncpus = 8\nmemory_mb = 16384\nload = 2.5\nqueue_waiting = 3\n\
         benchmarks = { specint = 2000 }\narch = \"aarch64\"\n",
    )
    .unwrap();
    let (mut sensor, _h) = simulation(cfg);
    let out = sample(&mut sensor, 1_700_000_000_123_456_789);
    let names: Vec<&str> = out.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["host.load", "host.cpu", "host.mem", "host.info"]);
    assert!(out
        .iter()
        .all(|e| e.source == "a" && e.timestamp_ns == 1_700_000_000_123_456_789));
    let load = &out[0].numbers;
    assert_eq!(&load[..6], &[2.5, 5.0, 8.0, 3.0, 16384.0, 2000.0]);
    assert!(load[6].is_nan(), "missing benchmark is NaN");
    let cpu = &out[1].numbers;
    let busy = 2.5 / 8.0 * 100.0;
    assert!((cpu[0] + cpu[2] - busy).abs() < 1e-9 && cpu[0] > cpu[2]);
    assert!((cpu[3] - (100.0 - busy)).abs() < 1e-9);
    assert!((cpu[..8].iter().sum::<f64>() - 100.0).abs() < 1e-9);
    assert_eq!(&cpu[8..12], &[2.5, 2.5, 2.5, 3.0]);
    let mem = &out[2].numbers;
    assert!((mem[7] - (15.0 + 70.0 * 2.5 / 8.0)).abs() < 1e-9);
    assert!(
        (mem[1] + mem[3] + mem[4] - mem[2]).abs() < 1e-6,
        "free + buffers + cached = available"
    );
    assert_eq!(
        out[3].strings,
        ["Linux (simulated)", "simulated", "aarch64", "a", "", "", "", ""]
    );
    assert_eq!(&out[3].numbers[..3], [8.0, 16384.0, 1_700_000_000.0]);
    assert!(out[3].numbers[3].is_nan(), "no simulated free disk");
}

#[test]
fn load5_and_load15_smooth_the_load() {
    let cfg = SimConfig::from_toml("[[host]]\nname = \"a\"\ncpus = 4\nmemory_mb = 1\nload = 0\n").unwrap();
    let (mut sensor, handle) = simulation(cfg);
    sample(&mut sensor, 0);
    handle.set("a", &[("load".into(), 4.0)]).unwrap();
    let mut last = (0.0, 0.0);
    for t in 1..=300 {
        let out = sample(&mut sensor, t);
        let cpu = &out[1].numbers;
        assert_eq!(cpu[8], 4.0);
        assert!(cpu[9] > last.0 && cpu[10] > last.1 && cpu[9] > cpu[10] && cpu[9] < 4.0);
        last = (cpu[9], cpu[10]);
    }
    // after 5 minutes at 1 s ticks, load5 has come 1 - 1/e of the way
    assert!((last.0 - 4.0 * (1.0 - (-1.0f64).exp())).abs() < 0.01, "{last:?}");
}

#[test]
fn info_on_first_tick_and_every_60() {
    let cfg = SimConfig::from_toml("[[host]]\nname = \"a\"\ncpus = 1\nmemory_mb = 1\n").unwrap();
    let (mut sensor, _) = simulation(cfg);
    let with_info: Vec<i64> = (0..130)
        .filter(|&t| sample(&mut sensor, t).iter().any(|e| e.name == "host.info"))
        .collect();
    assert_eq!(with_info, [0, 60, 120]);
}

#[test]
fn set_semantics() {
    let cfg = SimConfig::from_toml(
        "[[host]]\nname = \"w\"\ncpus = 4\nmemory_mb = 1024\nwalk = { min = 0, max = 4, step = 1, seed = 9 }\n",
    )
    .unwrap();
    let (mut sensor, handle) = simulation(cfg);
    assert_eq!(handle.hosts(), ["w"]);
    let loads = |sensor: &mut Box<dyn Sensor>, n: i64| -> Vec<f64> {
        (0..n).map(|t| sample(sensor, t)[0].numbers[0]).collect()
    };
    let walked = loads(&mut sensor, 20);
    assert!(walked.windows(2).any(|w| w[0] != w[1]), "walk moves");

    handle.set("w", &[("load".into(), 3.2)]).unwrap();
    let out = sample(&mut sensor, 100);
    assert_eq!(
        out[0].numbers[..3],
        [3.2, 0.0, 4.0],
        "free = max(0, 4 - ceil(3.2))"
    );
    assert!(
        loads(&mut sensor, 10).iter().all(|&l| l == 3.2),
        "setting load stops the walk"
    );

    handle.set("w", &[("cpus".into(), 16.0)]).unwrap();
    assert_eq!(
        values(&handle, "w")["free_cpus"],
        12.0,
        "derived free follows cpus"
    );
    handle
        .set("w", &[("free_cpus".into(), 1.0), ("load".into(), 0.0)])
        .unwrap();
    assert_eq!(values(&handle, "w")["free_cpus"], 1.0, "fixed free ignores load");
    handle
        .set(
            "w",
            &[
                ("queue_waiting".into(), 7.0),
                ("memory_mb".into(), 2048.0),
                ("bench_specint".into(), 1500.0),
                ("bench_specfp".into(), 1400.0),
            ],
        )
        .unwrap();
    let out = sample(&mut sensor, 200);
    assert_eq!(out[0].numbers, [0.0, 1.0, 16.0, 7.0, 2048.0, 1500.0, 1400.0]);
    handle.set("w", &[]).unwrap();
}

#[test]
fn set_errors_change_nothing() {
    let cfg = SimConfig::from_toml("[[host]]\nname = \"a\"\ncpus = 2\nmemory_mb = 1\nload = 1\n").unwrap();
    let (_sensor, handle) = simulation(cfg);
    // Debug text, since NaN (the unknown benchmarks) never equals itself
    let before = format!("{:?}", handle.get("a"));
    let e = handle
        .set("nope", &[("load".into(), 1.0)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown host \"nope\""), "{e}");
    let e = handle
        .set("a", &[("load".into(), 2.0), ("lod".into(), 1.0)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown key \"lod\""), "{e}");
    for k in SET_KEYS {
        assert!(e.contains(k), "{e} should list {k}");
    }
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let e = handle
            .set("a", &[("load".into(), 2.0), ("queue_waiting".into(), bad)])
            .unwrap_err();
        assert!(e.to_string().contains("queue_waiting must be"), "{e}");
    }
    let e = handle.set("a", &[("cpus".into(), 0.5)]).unwrap_err().to_string();
    assert!(e.contains("cpus must be at least 1"), "{e}");
    let after = format!("{:?}", handle.get("a"));
    assert_eq!(before, after, "a rejected set applies nothing");
    assert!(handle.get("nope").is_none());
}

#[test]
fn generate_names_count_and_determinism() {
    let text = "[[generate]]\ncount = 12\nprefix = \"sim\"\nseed = 7\nbenchmarks = { specint = 1000 }\n";
    let (mut s1, h1) = simulation(SimConfig::from_toml(text).unwrap());
    let (mut s2, _) = simulation(SimConfig::from_toml(text).unwrap());
    let hosts = h1.hosts();
    assert_eq!(hosts.len(), 12);
    assert_eq!(hosts[0], "sim-0000");
    assert_eq!(hosts[11], "sim-0011");
    for t in 0..5 {
        let (a, b) = (sample(&mut s1, t), sample(&mut s2, t));
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "same seed, same values");
    }
    let load = |h: &str| values(&h1, h);
    let (a, b) = (load("sim-0000"), load("sim-0001"));
    assert_ne!(a["load"], b["load"], "hosts differ");
    for h in &hosts {
        let v = load(h);
        assert!((0.0..=4.0).contains(&v["load"]), "default walk is [0, cpus]");
        assert_eq!(v["cpus"], 4.0);
        assert_eq!(v["memory_mb"], 8192.0);
        assert!((800.0..=1200.0).contains(&v["bench_specint"]), "{v:?}");
        assert!(v["bench_specfp"].is_nan());
    }
    let other = "[[generate]]\ncount = 12\nprefix = \"sim\"\nseed = 8\n";
    let (_, h3) = simulation(SimConfig::from_toml(other).unwrap());
    assert_ne!(
        values(&h3, "sim-0000")["load"],
        a["load"],
        "another seed, other hosts"
    );
}

#[test]
fn a_thousand_hosts_per_sample() {
    let text = "[[generate]]\ncount = 1000\nprefix = \"sim\"\nseed = 7\ncpus = 8\n\
                walk = { min = 0.5, max = 6.0, step = 0.2 }\nbenchmarks = { specint = 1000, specfp = 900 }\n";
    let (mut sensor, handle) = simulation(SimConfig::from_toml(text).unwrap());
    let schemas: HashMap<String, Layout> = sensor
        .schemas()
        .into_iter()
        .map(|s| (s.name.clone(), Layout::of(&s.fields)))
        .collect();
    let mut out = Vec::new();
    for tick in 0..3i64 {
        out.clear();
        sensor.sample(tick * 1_000_000_000, &mut out).unwrap();
        let want = if tick == 0 { 4000 } else { 3000 };
        assert_eq!(out.len(), want);
        for e in &out {
            let l = schemas[&e.name];
            assert_eq!(
                (e.numbers.len(), e.strings.len()),
                (l.doubles, l.strings),
                "{}",
                e.name
            );
            // host.info's disk_free_mb is not simulated: NaN, unknown.
            let known = if e.name == "host.info" { 3 } else { e.numbers.len() };
            assert!(e.numbers[..known].iter().all(|v| v.is_finite()), "{e:?}");
            validate_source(&e.source).unwrap();
        }
    }
    assert!(out
        .iter()
        .all(|e| e.name != "host.cpu" || (0.5..=6.0).contains(&e.numbers[8])));
    assert_eq!(handle.hosts().len(), 1000);
    handle.set("sim-0999", &[("load".into(), 7.0)]).unwrap();
}

#[test]
fn unvalidated_configs_do_not_panic() {
    let cfg = SimConfig {
        period_ms: 0,
        host: vec![HostSpec {
            name: "x".into(),
            cpus: 0,
            memory_mb: f64::NAN,
            benchmarks: Benchmarks::default(),
            load: Some(-3.0),
            walk: Some(WalkSpec {
                min: 5.0,
                max: 1.0,
                step: f64::NAN,
                seed: None,
            }),
            free_cpus: None,
            queue_waiting: -1.0,
            arch: None,
            os: None,
        }],
        generate: vec![],
    };
    let (mut sensor, _) = simulation(cfg);
    let out = sample(&mut sensor, 0);
    assert_eq!(out.len(), 4);
    assert!(
        out[0].numbers[..5].iter().all(|v| v.is_finite() && *v >= 0.0),
        "{:?}",
        out[0]
    );
    assert_eq!(sensor.period(), Duration::from_millis(1));
}
