//! `gma federation tree`: the hierarchy around a running federation endpoint
//! ([`gma_federation::tree`]) as text or JSON.

use anyhow::bail;
use serde_json::Value;

use crate::args::Output;
use gma_federation::tree::MAX_DEPTH;

/// A duration in ms as printed ("-" for none: negative).
pub(crate) fn ms_ago(v: i64) -> String {
    if v < 0 {
        "-".into()
    } else {
        format!("{v} ms")
    }
}

fn health(link: &Value) -> String {
    if link.is_null() {
        return String::new();
    }
    let heard = link["heard_ms_ago"].as_i64().unwrap_or(-1);
    let state = if link["live"] == true { "up" } else { "down" };
    let mut s = format!(
        "[link {state}, {}, last reply {}",
        link["session"].as_str().unwrap_or(""),
        if heard < 0 {
            "never".to_string()
        } else {
            format!("{} ago", ms_ago(heard))
        }
    );
    if let Some(e) = link["last_error"].as_str().filter(|e| !e.is_empty()) {
        s.push_str(&format!(", error: {e}"));
    }
    s.push(']');
    s
}

fn text_node(n: &Value, indent: usize, out: &mut Vec<String>) {
    let pad = "  ".repeat(indent);
    let free = if n["reachable"] == true {
        format!(
            "own {} free CPUs, subtree {} free CPUs",
            n["own_cpus_free"], n["subtree_cpus_free"]
        )
    } else {
        format!(
            "unreachable ({}); subtree {} free CPUs as last advertised",
            n["error"].as_str().unwrap_or(""),
            n["subtree_cpus_free"]
        )
    };
    out.push(format!(
        "{pad}{} {}  {free}  {}",
        n["site"].as_str().unwrap_or(""),
        n["endpoint"].as_str().unwrap_or(""),
        health(&n["link"])
    ));
    for c in n["inferiors"].as_array().into_iter().flatten() {
        text_node(c, indent + 1, out);
    }
}

fn text(t: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let sup = t["superiors"].as_array().cloned().unwrap_or_default();
    for (i, s) in sup.iter().rev().enumerate() {
        out.push(format!(
            "{}^ {} {}  superior of {}  {}{}",
            "  ".repeat(i),
            s["site"].as_str().unwrap_or(""),
            s["endpoint"].as_str().unwrap_or(""),
            s["below"].as_str().unwrap_or(""),
            health(&s["link"]),
            s["error"]
                .as_str()
                .map(|e| format!(" (unreachable: {e})"))
                .unwrap_or_default()
        ));
    }
    text_node(&t["root"], sup.len(), &mut out);
    out
}

pub async fn run(root: &str, depth: u32, output: Output) -> anyhow::Result<()> {
    if depth > MAX_DEPTH {
        bail!("--depth {depth} is more than {MAX_DEPTH}: give a smaller --depth");
    }
    let t = gma_federation::tree::walk(root, depth)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    match output {
        Output::Json => println!("{t}"),
        Output::Table => {
            for l in text(&t) {
                println!("{l}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_indents_superiors_then_the_tree() {
        let link = json!({"live": true, "session": "up", "heard_ms_ago": 40, "last_error": ""});
        let t = json!({
            "superiors": [{"site": "R", "endpoint": "r:1", "below": "A", "link": link}],
            "root": {"site": "A", "endpoint": "a:1", "reachable": true, "own_cpus_free": 3,
                     "subtree_cpus_free": 7, "link": null, "inferiors": [
                {"site": "A1", "endpoint": "a1:1", "reachable": false, "error": "refused",
                 "subtree_cpus_free": 4, "link": {"live": false, "session": "expired",
                 "heard_ms_ago": null, "last_error": "refused"}, "inferiors": []}]},
        });
        let lines = text(&t);
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(
            lines[0].starts_with("^ R r:1  superior of A  [link up, up, last reply 40 ms ago]"),
            "{lines:#?}"
        );
        assert!(
            lines[1].starts_with("  A a:1  own 3 free CPUs, subtree 7 free CPUs"),
            "{lines:#?}"
        );
        assert!(lines[2].contains("    A1 a1:1  unreachable (refused); subtree 4 free CPUs as last advertised  [link down, expired, last reply never, error: refused]"), "{lines:#?}");
    }
}
