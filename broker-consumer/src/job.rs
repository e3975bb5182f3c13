//! Job descriptions: the TOML job file of `gma broker select` (one job) and of
//! `gma broker coallocate` (a window and `[[job]]` tables), their validation with errors that
//! name the field, and the conversion to and from the `JobSpec` message.
//!
//! ```toml
//! name = "job1"
//! cpus = 4                         # required, >= 1
//! memory_mb = 1024                 # 0 / absent = any
//! arch = "x86_64"                  # absent = any
//! software = ["mpi"]               # runtime environments the resource must publish
//! reference_time_s = 3600          # required: run time on the reference machine
//! reference = { specint = 1000 }   # the reference machine's benchmark scores
//! stage_in_s = 60                  # or input_bytes = 1e9 (over the resource's bandwidth)
//! stage_out_s = 30                 # or output_bytes
//! deadline_s = 7200                # cost policy: must complete within this many seconds
//! budget = 10.0                    # cost policy: most it may cost
//! tradeoff = 1.0                   # cost policy: 1 = cheapest, 0 = fastest
//! user_class = "guest"             # utility policy: guest, other_vo, local, admin
//! utility_operator = "and"         # or "or"
//! [[utility]]                      # partial requirements (utility policy)
//! attribute = "free_cpus"
//! weight = 0.5
//! intervals = [{ min = 4, utility = 1.0 }, { min = 2, max = 4, utility = 0.5 }]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use gma_proto::v1 as pb;
use serde::Deserialize;

use crate::utility::{Interval, Operator, Requirement, UserClass};

/// Most resources a job may restrict itself to, requirements, software entries, benchmarks.
pub const MAX_LIST: usize = 1024;
/// Most jobs one coallocation may hold.
pub const MAX_COALLOC_JOBS: usize = 64;

/// A job to place (validated by [`Job::validate`]).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub name: String,
    pub cpus: u32,
    #[serde(default)]
    pub memory_mb: f64,
    #[serde(default)]
    pub arch: String,
    #[serde(default)]
    pub software: Vec<String>,
    pub reference_time_s: f64,
    #[serde(default)]
    pub reference: BTreeMap<String, f64>,
    pub stage_in_s: Option<f64>,
    pub input_bytes: Option<f64>,
    pub stage_out_s: Option<f64>,
    pub output_bytes: Option<f64>,
    pub deadline_s: Option<f64>,
    pub budget: Option<f64>,
    pub tradeoff: Option<f64>,
    #[serde(default)]
    pub user_class: UserClass,
    #[serde(default)]
    pub utility: Vec<Requirement>,
    #[serde(default)]
    pub utility_operator: Operator,
    #[serde(default)]
    pub offset_s: i64,
    #[serde(default)]
    pub candidates: Vec<String>,
    pub walltime_s: Option<f64>,
}

pub use crate::error::JobError;

fn field(field: impl Into<String>, message: impl Into<String>) -> JobError {
    JobError::Field {
        field: field.into(),
        message: message.into(),
    }
}

fn non_negative(name: &str, v: Option<f64>) -> Result<(), JobError> {
    match v {
        Some(x) if !x.is_finite() || x < 0.0 => Err(field(name, "must be a finite number >= 0")),
        _ => Ok(()),
    }
}

impl Job {
    /// Checks every field; the error names the first bad one (prefixed by `at`, e.g. `job[2].`).
    pub fn validate(&self) -> Result<(), JobError> {
        self.validate_at("")
    }

    pub fn validate_at(&self, at: &str) -> Result<(), JobError> {
        let f = |name: &str| format!("{at}{name}");
        if self.name.trim().is_empty() {
            return Err(field(f("name"), "give the job a name"));
        }
        if self.name.len() > 256 {
            return Err(field(f("name"), "at most 256 bytes"));
        }
        if self.cpus == 0 {
            return Err(field(f("cpus"), "must be at least 1"));
        }
        if !self.memory_mb.is_finite() || self.memory_mb < 0.0 {
            return Err(field(f("memory_mb"), "must be a finite number >= 0"));
        }
        if !self.reference_time_s.is_finite() || self.reference_time_s <= 0.0 {
            return Err(field(
                f("reference_time_s"),
                "must be a finite number of seconds > 0",
            ));
        }
        for (b, score) in &self.reference {
            if b.is_empty() || b.len() > 64 {
                return Err(field(f("reference"), "benchmark names are 1..=64 bytes"));
            }
            if !score.is_finite() || *score <= 0.0 {
                return Err(field(
                    f(&format!("reference.{b}")),
                    "a benchmark score must be a finite number > 0",
                ));
            }
        }
        for (name, v) in [
            ("stage_in_s", self.stage_in_s),
            ("input_bytes", self.input_bytes),
            ("stage_out_s", self.stage_out_s),
            ("output_bytes", self.output_bytes),
            ("budget", self.budget),
        ] {
            non_negative(&f(name), v)?;
        }
        if self.stage_in_s.is_some() && self.input_bytes.is_some() {
            return Err(field(f("stage_in_s"), "give stage_in_s or input_bytes, not both"));
        }
        if self.stage_out_s.is_some() && self.output_bytes.is_some() {
            return Err(field(
                f("stage_out_s"),
                "give stage_out_s or output_bytes, not both",
            ));
        }
        if let Some(d) = self.deadline_s {
            if !d.is_finite() || d <= 0.0 {
                return Err(field(f("deadline_s"), "must be a finite number of seconds > 0"));
            }
        }
        if let Some(t) = self.tradeoff {
            if !(0.0..=1.0).contains(&t) {
                return Err(field(
                    f("tradeoff"),
                    "must be within 0..=1 (1 = cheapest, 0 = fastest)",
                ));
            }
        }
        if let Some(w) = self.walltime_s {
            if !w.is_finite() || w < 1.0 {
                return Err(field(f("walltime_s"), "must be a finite number of seconds >= 1"));
            }
        }
        for (what, list) in [("software", &self.software), ("candidates", &self.candidates)] {
            if list.len() > MAX_LIST {
                return Err(field(f(what), format!("at most {MAX_LIST} entries")));
            }
            if list.iter().any(|s| s.is_empty() || s.len() > 256) {
                return Err(field(f(what), "entries are 1..=256 bytes"));
            }
        }
        if self.utility.len() > 64 {
            return Err(field(f("utility"), "at most 64 requirements"));
        }
        for (i, r) in self.utility.iter().enumerate() {
            r.check(&f(&format!("utility[{i}]"))).map_err(|e| {
                let m = e.to_string();
                match m.split_once(": ") {
                    Some((fld, msg)) => field(fld, msg),
                    None => field(f("utility"), m),
                }
            })?;
        }
        if self.offset_s.unsigned_abs() > 365 * 86_400 {
            return Err(field(f("offset_s"), "at most a year"));
        }
        Ok(())
    }

    /// Reads and validates a one-job TOML file.
    pub fn load(path: &Path) -> Result<Job, JobError> {
        validated(load_toml(path)?, Job::validate)
    }

    /// Parses and validates one-job TOML text (`origin` names it in errors).
    pub fn from_toml(text: &str, origin: &str) -> Result<Job, JobError> {
        validated(parse_toml(text, origin)?, Job::validate)
    }

    /// The reservation length of this job in coallocation (walltime, else the reference time).
    pub fn walltime(&self) -> i64 {
        self.walltime_s.unwrap_or(self.reference_time_s).ceil().max(1.0) as i64
    }

    pub fn to_proto(&self) -> pb::JobSpec {
        pb::JobSpec {
            name: self.name.clone(),
            cpus: self.cpus,
            memory_mb: self.memory_mb,
            arch: self.arch.clone(),
            software: self.software.clone(),
            reference_time_s: self.reference_time_s,
            reference: self.reference.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            stage_in_s: self.stage_in_s,
            input_bytes: self.input_bytes,
            stage_out_s: self.stage_out_s,
            output_bytes: self.output_bytes,
            deadline_s: self.deadline_s,
            budget: self.budget,
            tradeoff: self.tradeoff,
            user_class: self.user_class.as_str().into(),
            utility: self
                .utility
                .iter()
                .map(|r| pb::UtilityRequirement {
                    attribute: r.attribute.clone(),
                    intervals: r
                        .intervals
                        .iter()
                        .map(|i| pb::UtilityInterval {
                            min: i.min,
                            max: i.max,
                            utility: i.utility,
                        })
                        .collect(),
                    weight: r.weight,
                })
                .collect(),
            utility_operator: self.utility_operator.as_str().into(),
            offset_s: self.offset_s,
            candidates: self.candidates.clone(),
            walltime_s: self.walltime_s,
        }
    }

    /// The job a request carries, validated (errors name the field, prefixed by `at`).
    pub fn from_proto(p: &pb::JobSpec, at: &str) -> Result<Job, JobError> {
        let user_class = UserClass::parse(&p.user_class).ok_or_else(|| {
            field(
                format!("{at}user_class"),
                format!(
                    "unknown class {:?} (guest, other_vo, local, admin)",
                    gma_core::clip(&p.user_class, 32)
                ),
            )
        })?;
        let utility_operator = Operator::parse(&p.utility_operator)
            .ok_or_else(|| field(format!("{at}utility_operator"), "must be \"and\" or \"or\""))?;
        let job = Job {
            name: p.name.clone(),
            cpus: p.cpus,
            memory_mb: p.memory_mb,
            arch: p.arch.clone(),
            software: p.software.clone(),
            reference_time_s: p.reference_time_s,
            reference: p.reference.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            stage_in_s: p.stage_in_s,
            input_bytes: p.input_bytes,
            stage_out_s: p.stage_out_s,
            output_bytes: p.output_bytes,
            deadline_s: p.deadline_s,
            budget: p.budget,
            tradeoff: p.tradeoff,
            user_class,
            utility: p
                .utility
                .iter()
                .map(|r| Requirement {
                    attribute: r.attribute.clone(),
                    intervals: r
                        .intervals
                        .iter()
                        .map(|i| Interval {
                            min: i.min,
                            max: i.max,
                            utility: i.utility,
                        })
                        .collect(),
                    weight: r.weight,
                })
                .collect(),
            utility_operator,
            offset_s: p.offset_s,
            candidates: p.candidates.iter().filter(|c| !c.is_empty()).cloned().collect(),
            walltime_s: p.walltime_s,
        };
        job.validate_at(at)?;
        Ok(job)
    }
}

/// The job file of `gma broker coallocate`: a start window and the jobs to start together.
///
/// ```toml
/// start_in_s = 600        # the window opens this far from now (default 0) ...
/// # window_start_s = 1767000000   # ... or at this Unix time
/// window_s = 14400        # latest common start = window start + this (default 4 h)
/// epsilon_s = 300         # most the starts may differ (default 5 min)
/// [[job]]
/// name = "part1"
/// cpus = 8
/// reference_time_s = 3600 # reserved for walltime_s (default: reference_time_s)
/// offset_s = 0            # start offset from the common start
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CoallocFile {
    pub start_in_s: Option<i64>,
    pub window_start_s: Option<i64>,
    pub window_s: Option<i64>,
    pub epsilon_s: Option<i64>,
    #[serde(default)]
    pub job: Vec<Job>,
}

/// The `[[job]]` tables of a file: 1 to `max`, each valid (`job[i].` in front of the field),
/// names unique.
pub(crate) fn validate_jobs(jobs: &[Job], max: usize) -> Result<(), JobError> {
    if jobs.is_empty() {
        return Err(field("job", "give at least one [[job]] table"));
    }
    if jobs.len() > max {
        return Err(field("job", format!("at most {max} jobs")));
    }
    let mut names = std::collections::HashSet::new();
    for (i, j) in jobs.iter().enumerate() {
        j.validate_at(&format!("job[{i}]."))?;
        if !names.insert(j.name.as_str()) {
            return Err(field(
                format!("job[{i}].name"),
                format!("{:?} is used twice", j.name),
            ));
        }
    }
    Ok(())
}

/// `value` once `validate` accepts it.
pub(crate) fn validated<T>(value: T, validate: fn(&T) -> Result<(), JobError>) -> Result<T, JobError> {
    validate(&value)?;
    Ok(value)
}

pub const DEFAULT_WINDOW_S: i64 = 4 * 3600;
pub const DEFAULT_EPSILON_S: i64 = 300;

impl CoallocFile {
    pub fn load(path: &Path) -> Result<CoallocFile, JobError> {
        validated(load_toml(path)?, CoallocFile::validate)
    }

    pub fn from_toml(text: &str, origin: &str) -> Result<CoallocFile, JobError> {
        validated(parse_toml(text, origin)?, CoallocFile::validate)
    }

    pub fn validate(&self) -> Result<(), JobError> {
        validate_jobs(&self.job, MAX_COALLOC_JOBS)?;
        if self.start_in_s.is_some() && self.window_start_s.is_some() {
            return Err(field("start_in_s", "give start_in_s or window_start_s, not both"));
        }
        if self.start_in_s.is_some_and(|s| !(0..=365 * 86_400).contains(&s)) {
            return Err(field("start_in_s", "must be within 0..=31536000 seconds"));
        }
        if self.window_start_s.is_some_and(|s| s <= 0) {
            return Err(field("window_start_s", "must be a Unix time in seconds"));
        }
        if self.window_s.is_some_and(|s| !(0..=365 * 86_400).contains(&s)) {
            return Err(field("window_s", "must be within 0..=31536000 seconds"));
        }
        if self.epsilon_s.is_some_and(|s| !(1..=86_400).contains(&s)) {
            return Err(field("epsilon_s", "must be within 1..=86400 seconds"));
        }
        Ok(())
    }

    /// The request for the broker, with the window resolved against `now_s`.
    pub fn to_request(&self, now_s: i64, policy: pb::BrokerPolicy) -> pb::CoallocateRequest {
        let start = self
            .window_start_s
            .unwrap_or(now_s + self.start_in_s.unwrap_or(0));
        pb::CoallocateRequest {
            jobs: self.job.iter().map(Job::to_proto).collect(),
            window_start_s: start,
            window_end_s: start + self.window_s.unwrap_or(DEFAULT_WINDOW_S),
            epsilon_s: self.epsilon_s.unwrap_or(DEFAULT_EPSILON_S),
            policy: policy as i32,
            owner: String::new(),
            runs: Vec::new(),
        }
    }
}

pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(text: &str, origin: &str) -> Result<T, JobError> {
    gma_core::config::parse_toml(text, origin).map_err(|e| match e {
        gma_core::config::ConfigError::Parse { path, message } => JobError::Parse { path, message },
        gma_core::config::ConfigError::Read { path, source } => JobError::Read {
            path,
            message: source.to_string(),
        },
    })
}

pub(crate) fn load_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, JobError> {
    let text = std::fs::read_to_string(path).map_err(|e| JobError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    parse_toml(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
name = "job1"
cpus = 4
memory_mb = 1024
reference_time_s = 3600
reference = { specint = 1000 }
stage_in_s = 60
stage_out_s = 30
user_class = "local"
[[utility]]
attribute = "free_cpus"
intervals = [{ min = 4, utility = 1.0 }, { min = 2, max = 4, utility = 0.5 }]
"#;

    #[test]
    fn the_issue_example_parses() {
        let j = Job::from_toml(EXAMPLE, "job.toml").unwrap();
        assert_eq!(j.cpus, 4);
        assert_eq!(j.reference["specint"], 1000.0);
        assert_eq!(j.stage_in_s, Some(60.0));
        assert_eq!(j.user_class, UserClass::Local);
        assert_eq!(j.utility[0].intervals.len(), 2);
        // Round trip through the wire form.
        let back = Job::from_proto(&j.to_proto(), "").unwrap();
        assert_eq!(back, j);
    }

    #[test]
    fn bad_job_files_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("name = \"j\"\ncpus = 0\nreference_time_s = 1\n", "cpus: must be at least 1"),
            ("name = \"j\"\ncpus = 1\nreference_time_s = -1\n", "reference_time_s:"),
            ("name = \"j\"\ncpus = 1\n", "missing field `reference_time_s`"),
            ("name = \"j\"\ncpus = 1\nreference_time_s = 1\ncpu = 2\n", "unknown field `cpu`"),
            (
                "name = \"j\"\ncpus = 1\nreference_time_s = 1\nreference = { specint = 0 }\n",
                "reference.specint: a benchmark score must be a finite number > 0",
            ),
            (
                "name = \"j\"\ncpus = 1\nreference_time_s = 1\nstage_in_s = 1\ninput_bytes = 5\n",
                "stage_in_s: give stage_in_s or input_bytes, not both",
            ),
            ("name = \"j\"\ncpus = 1\nreference_time_s = 1\ntradeoff = 2\n", "tradeoff: must be within"),
            ("name = \"j\"\ncpus = 1\nreference_time_s = 1\nuser_class = \"boss\"\n", "unknown variant `boss`"),
            (
                "name = \"j\"\ncpus = 1\nreference_time_s = 1\n[[utility]]\nattribute = \"free_cpus\"\nintervals = [{ utility = 3 }]\n",
                "utility[0].intervals[0].utility: must be within 0..=1",
            ),
            ("name = \"\"\ncpus = 1\nreference_time_s = 1\n", "name: give the job a name"),
            ("name = \"j\"\ncpus = \"four\"\nreference_time_s = 1\n", "line 2, column 8"),
        ];
        for (text, want) in cases {
            let e = Job::from_toml(text, "job.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e} (wanted {want:?})");
        }
    }

    #[test]
    fn proto_jobs_are_validated_with_the_field_named() {
        let mut p = Job::from_toml(EXAMPLE, "j").unwrap().to_proto();
        p.user_class = "boss".into();
        let e = Job::from_proto(&p, "job.").unwrap_err().to_string();
        assert!(e.starts_with("job.user_class: unknown class"), "{e}");
        p.user_class = String::new();
        p.memory_mb = f64::NAN;
        let e = Job::from_proto(&p, "").unwrap_err().to_string();
        assert!(e.starts_with("memory_mb:"), "{e}");
    }

    #[test]
    fn coallocation_files_resolve_their_window() {
        let text = "start_in_s = 60\nepsilon_s = 120\n[[job]]\nname = \"a\"\ncpus = 2\nreference_time_s = 600\n\
                    [[job]]\nname = \"b\"\ncpus = 1\nreference_time_s = 600\nwalltime_s = 900\noffset_s = 300\n";
        let f = CoallocFile::from_toml(text, "jobs.toml").unwrap();
        let r = f.to_request(1_000, pb::BrokerPolicy::Ttd);
        assert_eq!(
            (r.window_start_s, r.window_end_s, r.epsilon_s),
            (1_060, 1_060 + DEFAULT_WINDOW_S, 120)
        );
        assert_eq!(f.job[1].walltime(), 900);
        assert_eq!(f.job[0].walltime(), 600);
        let dup = "[[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 1\n[[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 1\n";
        let e = CoallocFile::from_toml(dup, "j").unwrap_err().to_string();
        assert!(e.contains("job[1].name"), "{e}");
        let e = CoallocFile::from_toml("window_s = 5\n", "j")
            .unwrap_err()
            .to_string();
        assert!(e.contains("job: give at least one [[job]] table"), "{e}");
        let bad = "[[job]]\nname = \"a\"\ncpus = 0\nreference_time_s = 1\n";
        let e = CoallocFile::from_toml(bad, "j").unwrap_err().to_string();
        assert!(e.contains("job[0].cpus"), "{e}");
    }
}
