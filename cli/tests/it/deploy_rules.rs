//! `deploy/`'s monitoring kit as CI checks it: Prometheus's configuration,
//! the alert rules and their unit tests (promtool), the Alertmanager
//! routing, the Grafana dashboard, and that every llmgw series they name
//! is one a running server or agent exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::Child;
use super::cluster::{EngineSweeper, free_port, get, ready_replicas, until};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A Prometheus tool: `$PROMTOOL`/`$AMTOOL` or the one on PATH.
fn tool(name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(name.to_uppercase()) {
        return Some(p.into());
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn promtool() -> PathBuf {
    tool("promtool").expect(
        "promtool is not installed: scripts/test installs it (Debian: apt-get install prometheus)",
    )
}

/// Runs `program args` in deploy/prometheus; fails with its output unless
/// it succeeds.
fn passes(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(deploy().join("prometheus"))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} {} failed:\n{text}",
        program.display(),
        args.join(" ")
    );
    text
}

fn rule_tests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy().join("prometheus/tests"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no rule tests in deploy/prometheus/tests"
    );
    files
}

/// The alerting rules, by name.
fn alerts() -> BTreeMap<String, Value> {
    let rules = yaml(&deploy().join("prometheus/rules/llmgw.rules.yml"));
    let mut out = BTreeMap::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            if let Some(name) = rule["alert"].as_str() {
                assert!(
                    out.insert(name.to_owned(), rule.clone()).is_none(),
                    "{name} twice"
                );
            }
        }
    }
    out
}

#[test]
fn promtool_accepts_the_scrape_configuration_and_its_rule_files() {
    let out = passes(&promtool(), &["check", "config", "prometheus.yml"]);
    assert!(out.contains("1 rule files found"), "{out}");
}

#[test]
fn promtool_accepts_the_alert_rules() {
    passes(&promtool(), &["check", "rules", "rules/llmgw.rules.yml"]);
}

#[test]
fn the_alert_rules_pass_their_unit_tests() {
    let files: Vec<String> = rule_tests()
        .iter()
        .map(|p| format!("tests/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    passes(&promtool(), &args);
}

/// Ours and the reference's thirteen, each with a severity and a text
/// that says what to do.
#[test]
fn every_alert_is_there_with_a_severity_and_advice() {
    let alerts = alerts();
    let expected = [
        "ControlPlaneUnreachable",
        "NodeNotReady",
        "AgentGoneQuiet",
        "ModelHasNothingServing",
        "PoolSaturated",
        "EndpointBreakerOpen",
        "EndpointMetricsStale",
        "NodeDiskFilling",
        "MonitoringDiskFilling",
        "MonitoringDiskAlmostFull",
        "HighErrorRate",
        "SlowFirstToken",
        "RequestsBeingRejected",
        "NoLeader",
        "ProjectionLagging",
        "EventChainBroken",
        "UsageDropped",
        "OpenFilesNearLimit",
    ];
    assert_eq!(
        alerts.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        expected.into_iter().collect::<BTreeSet<_>>()
    );
    for (name, rule) in &alerts {
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for what in ["summary", "description"] {
            assert!(
                rule["annotations"][what]
                    .as_str()
                    .is_some_and(|t| t.len() > 20),
                "{name} has no {what}"
            );
        }
        // Alerts about llmgw name the command to look with.
        let expr = rule["expr"].as_str().unwrap();
        if expr.contains("llmgw") {
            let description = rule["annotations"]["description"].as_str().unwrap();
            assert!(
                !commands(description).is_empty(),
                "{name}'s description names no llmgw command: {description}"
            );
        }
    }
}

/// The `llmgw …` commands quoted in a text, as their subcommand words
/// (`llmgw ctl logs NODE --source SHARD` is `["ctl", "logs"]`).
fn commands(text: &str) -> Vec<Vec<String>> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|quoted| quoted.strip_prefix("llmgw "))
        .map(|rest| {
            rest.split_whitespace()
                .take_while(|w| {
                    w.chars()
                        .all(|c| c.is_ascii_lowercase() || c == '-' || c == '_')
                        && !w.starts_with('-')
                })
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// The advice in the alerts names commands that exist.
#[test]
fn the_commands_the_alerts_advise_exist() {
    let mut seen = BTreeSet::new();
    for (name, rule) in alerts() {
        for what in ["summary", "description"] {
            for words in commands(rule["annotations"][what].as_str().unwrap()) {
                if !seen.insert(words.clone()) {
                    continue;
                }
                let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
                    .args(&words)
                    .arg("--help")
                    .output()
                    .unwrap();
                assert!(
                    out.status.success() && !words.is_empty(),
                    "{name} advises `llmgw {}`, which is not a command: {}",
                    words.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    assert!(seen.len() >= 8, "{seen:?}");
}

/// The unit tests, per alert: the labels of every case that expects it to
/// fire, and whether some case expects it quiet.
fn cases() -> BTreeMap<String, (Vec<Value>, bool)> {
    let mut out: BTreeMap<String, (Vec<Value>, bool)> = BTreeMap::new();
    for file in rule_tests() {
        let doc = yaml(&file);
        for test in doc["tests"].as_array().unwrap() {
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap().to_owned();
                let expected = case["exp_alerts"].as_array().cloned().unwrap_or_default();
                let entry = out.entry(name).or_default();
                entry.1 |= expected.is_empty();
                entry
                    .0
                    .extend(expected.iter().map(|a| a["exp_labels"].clone()));
            }
        }
    }
    out
}

/// promtool passes a rule nobody tests; this does not.
#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() {
    let cases = cases();
    for (name, rule) in alerts() {
        let (firing, quiet) = cases
            .get(&name)
            .unwrap_or_else(|| panic!("{name} has no unit test"));
        assert!(!firing.is_empty(), "no test of {name} expects it to fire");
        assert!(*quiet, "no test of {name} expects it quiet");
        for labels in firing {
            assert_eq!(
                labels["severity"], rule["labels"]["severity"],
                "{name}: {labels}"
            );
        }
    }
    assert!(cases.keys().all(|n| alerts().contains_key(n)), "{cases:?}");
}

/// amtool checks the file when it is installed (Debian's
/// prometheus-alertmanager); either way, the routing and the inhibitions
/// must name alerts, severities and labels that exist.
#[test]
fn alertmanager_routes_and_inhibits_alerts_that_exist() {
    if let Some(amtool) = tool("amtool") {
        passes(&amtool, &["check-config", "alertmanager.yml"]);
    }
    let am = yaml(&deploy().join("prometheus/alertmanager.yml"));
    let alerts = alerts();
    let cases = cases();
    let severities: BTreeSet<&str> = alerts
        .values()
        .filter_map(|r| r["labels"]["severity"].as_str())
        .collect();
    // Labels Prometheus adds to every alert it sends.
    let prometheus = yaml(&deploy().join("prometheus/prometheus.yml"));
    let external: BTreeSet<String> = prometheus["global"]["external_labels"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let matcher = |m: &Value| -> (String, String) {
        let m = m.as_str().unwrap();
        let (label, value) = m.split_once('=').unwrap_or_else(|| panic!("{m}"));
        (label.to_owned(), value.trim_matches('"').to_owned())
    };
    let check = |m: &(String, String)| match m.0.as_str() {
        "alertname" => assert!(alerts.contains_key(&m.1), "no alert {}", m.1),
        "severity" => assert!(severities.contains(m.1.as_str()), "no severity {}", m.1),
        other => panic!("a matcher on {other}"),
    };

    let receivers: BTreeSet<&str> = am["receivers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    let route = &am["route"];
    assert_eq!(route["receiver"], "none");
    assert_eq!(
        route["group_by"],
        serde_json::json!(["alertname", "node", "model"])
    );
    assert!(!route["routes"].as_array().unwrap().is_empty());
    for sub in route["routes"].as_array().unwrap() {
        assert!(receivers.contains(sub["receiver"].as_str().unwrap()));
        for m in sub["matchers"].as_array().unwrap() {
            check(&matcher(m));
        }
    }

    let inhibitions = am["inhibit_rules"].as_array().unwrap();
    assert_eq!(inhibitions.len(), 2);
    for rule in inhibitions {
        let sources: Vec<_> = rule["source_matchers"]
            .as_array()
            .unwrap()
            .iter()
            .map(matcher)
            .collect();
        let targets: Vec<_> = rule["target_matchers"]
            .as_array()
            .unwrap()
            .iter()
            .map(matcher)
            .collect();
        sources.iter().chain(&targets).for_each(check);
        // The labels both sides must share are ones both have (as their
        // unit tests expect them), or ones Prometheus adds.
        for label in rule["equal"].as_array().into_iter().flatten() {
            let label = label.as_str().unwrap();
            if external.contains(label) {
                continue;
            }
            for (_, alert) in sources
                .iter()
                .chain(&targets)
                .filter(|m| m.0 == "alertname")
            {
                assert!(
                    cases[alert].0.iter().all(|l| l.get(label).is_some()),
                    "inhibition on {label}, which {alert} does not carry"
                );
            }
        }
    }
}

fn dashboard() -> Value {
    let path = deploy().join("grafana/llmgw-overview.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Panels that show data, rows left out, with the rows' nested panels.
fn data_panels(dash: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten().cloned());
        } else {
            out.push(p.clone());
        }
    }
    out
}

/// Every PromQL expression of the dashboard, Grafana's variables replaced
/// by what they stand for.
fn dashboard_exprs(dash: &Value) -> Vec<String> {
    data_panels(dash)
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$__range", "1h")
        })
        .collect()
}

#[test]
fn the_dashboard_queries_prometheus_in_every_panel() {
    let dash = dashboard();
    assert_eq!(dash["uid"], "llmgw-overview");
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    let ds = &dash["templating"]["list"][0];
    assert_eq!(
        (&ds["name"], &ds["type"], &ds["query"]),
        (
            &Value::from("DS_PROMETHEUS"),
            &Value::from("datasource"),
            &Value::from("prometheus")
        )
    );
    let panels = data_panels(&dash);
    let mut ids = BTreeSet::new();
    let rows = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row");
    for p in rows.chain(&panels) {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "id twice: {p}");
        assert!(p["gridPos"]["w"].as_u64().unwrap() > 0, "{}", p["title"]);
    }
    for p in &panels {
        let title = p["title"].as_str().unwrap();
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        assert!(!targets.is_empty(), "{title} has no target");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
            assert!(
                t["expr"].as_str().is_some_and(|e| e.contains("llmgw_")),
                "{title}: {t}"
            );
        }
    }
    let titles: BTreeSet<&str> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    for want in [
        "Nodes ready",
        "Models serving",
        "Requests per second by model",
        "Pool saturation",
        "Time to first token",
        "Tokens per second",
        "Queue",
        "KV cache usage",
        "Disk free",
        "Last seen",
        "Replicas by state",
        "GPU memory used",
        "GPU temperature",
        "GPU utilisation",
        "GPU ECC errors",
        "Projection lag",
        "Append latency",
    ] {
        assert!(titles.contains(want), "no panel {want:?}: {titles:?}");
    }
    // Saturation shows the ceiling as a red line at 1.
    let saturation = panels
        .iter()
        .find(|p| p["title"] == "Pool saturation")
        .unwrap();
    let defaults = &saturation["fieldConfig"]["defaults"];
    assert_eq!(defaults["custom"]["thresholdsStyle"]["mode"], "line");
    assert!(
        defaults["thresholds"]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["value"] == 1.0 && s["color"] == "red"),
        "{defaults}"
    );
}

/// promtool parses each of the dashboard's queries (as a recording rule).
#[test]
fn the_dashboards_queries_are_promql() {
    let exprs = dashboard_exprs(&dashboard());
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(e).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard.rules.yml");
    std::fs::write(&file, rules).unwrap();
    let out = passes(&promtool(), &["check", "rules", file.to_str().unwrap()]);
    assert!(
        out.contains(&format!("{} rules found", exprs.len())),
        "{out}"
    );
}

/// Every `llmgw_…` name in `text`: identifiers as PromQL spells them.
fn llmgw_names(text: &str) -> BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| ident(c)) {
        let tail = &rest[start..];
        let end = tail.find(|c: char| !ident(c)).unwrap_or(tail.len());
        let word = &tail[..end];
        if word.starts_with("llmgw_") {
            out.insert(word.to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// The sample names a scrape offers: those it has samples for, and those
/// its families' TYPE lines promise (a family may have no sample yet).
fn exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let with = |s: &str| format!("{name}{s}");
            match kind {
                "counter" if name.ends_with("_total") => out.extend([name.to_owned()]),
                "counter" => out.extend([with("_total"), with("_created")]),
                "histogram" => out.extend([with("_bucket"), with("_sum"), with("_count")]),
                "summary" => out.extend([name.to_owned(), with("_sum"), with("_count")]),
                "info" => out.extend([with("_info")]),
                _ => out.extend([name.to_owned()]),
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                out.insert(line[..end].to_owned());
            }
        }
    }
    out
}

/// Waits for a line on `child`'s stdout starting with each prefix, in any
/// order; returns what follows each.
fn addresses(child: &Child, prefixes: &[&str]) -> Vec<String> {
    let mut found = vec![None; prefixes.len()];
    while found.iter().any(Option::is_none) {
        let Ok(line) = child
            .stdout
            .recv_timeout(std::time::Duration::from_secs(20))
        else {
            let stderr: Vec<String> = child.stderr.try_iter().collect();
            panic!(
                "no lines {prefixes:?} (found {found:?}); stderr:\n{}",
                stderr.join("\n")
            );
        };
        for (i, p) in prefixes.iter().enumerate() {
            if let Some(rest) = line.strip_prefix(p) {
                found[i] = Some(rest.trim().to_owned());
            }
        }
    }
    found.into_iter().map(Option::unwrap).collect()
}

/// A stand-in nvidia-smi answering with one healthy H100, so that the GPU
/// series have a card to describe.
fn fake_gpu(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("nvidia-smi");
    std::fs::write(
        &path,
        "#!/bin/sh\necho '0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 1024, 9.0, 00000000:1B:00.0, 550.54, 41, 0, 7'\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// THE check: a server with its control plane and usage recording, an
/// agent serving a sim model with a GPU, a request answered; then every
/// llmgw series the alert rules and the dashboard read is in what the
/// server's metrics listener and the agent's export.
#[tokio::test]
async fn every_series_the_rules_and_the_dashboard_read_is_exported() {
    let ip = "127.0.21.2";
    let _engines = EngineSweeper("127.0.21.".into());
    let dir = tempfile::tempdir().unwrap();
    let agent_port = free_port();
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nmetrics_listen: \"127.0.0.1:0\"\nagent_listen: \"127.0.0.1:{agent_port}\"\nstore: \"sqlite://{}\"\nrecord_usage: true\ncontrol:\n  interval: 200ms\n  port_range: [30700, 30709]\nmodels:\n  - name: chat\n    scaling: {{min: 1, max: 1}}\n    profiles:\n      - name: sim\n        engine: sim\n",
            dir.path().join("llmgw.db").display()
        ),
    )
    .unwrap();
    let server = Child::spawn(&["server", "--config", config.to_str().unwrap()]);
    let [client, admin, metrics] = addresses(
        &server,
        &[
            "client listening on ",
            "admin listening on ",
            "metrics listening on ",
        ],
    )
    .try_into()
    .unwrap();
    let (work, cache) = (dir.path().join("work"), dir.path().join("cache"));
    let smi = fake_gpu(dir.path());
    let server_addr = format!("127.0.0.1:{agent_port}");
    let agent = Child::spawn(&[
        "agent",
        "run",
        "--server",
        &server_addr,
        "--node-id",
        "metrics-1",
        "--heartbeat-s",
        "0.2",
        "--engine-bind",
        ip,
        "--mgmt-addr",
        ip,
        "--nvidia-smi",
        smi.to_str().unwrap(),
        "--work-dir",
        work.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let [agent_metrics] = addresses(&agent, &["metrics listening on "])
        .try_into()
        .unwrap();
    until("a ready replica", || async {
        let rows = get(format!("http://{admin}/api/v1/replicas")).await;
        (!ready_replicas(&rows).is_empty()).then_some(())
    })
    .await;
    let http = reqwest::Client::new();
    until("the gateway routes to it", || async {
        let r = http
            .post(format!("http://{client}/v1/chat/completions"))
            .json(
                &serde_json::json!({"model": "chat", "stream": true, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hello"}]}),
            )
            .send()
            .await
            .ok()?;
        (r.status() == 200 && r.text().await.ok()?.contains("[DONE]")).then_some(())
    })
    .await;

    let scrape = |addr: String| async move {
        let r = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    };
    let server_text = scrape(metrics).await;
    let agent_text = scrape(agent_metrics).await;
    let mut have = exported(&server_text);
    have.extend(exported(&agent_text));

    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, rule) in alerts() {
        let mut text = rule["expr"].as_str().unwrap().to_owned();
        for a in rule["annotations"].as_object().into_iter().flatten() {
            text.push_str(a.1.as_str().unwrap_or_default());
        }
        for n in llmgw_names(&text) {
            used.entry(n).or_default().insert(format!("alert {name}"));
        }
    }
    for e in dashboard_exprs(&dashboard()) {
        for n in llmgw_names(&e) {
            used.entry(n).or_default().insert("the dashboard".into());
        }
    }
    assert!(used.len() > 30, "{used:?}");
    let missing: Vec<String> = used
        .iter()
        .filter(|(n, _)| !have.contains(*n))
        .map(|(n, by)| {
            format!(
                "{n} (read by {})",
                by.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not exported:\n  {}\n--- server:\n{server_text}\n--- agent:\n{agent_text}",
        missing.join("\n  ")
    );
    drop(agent);
    drop(server);
}

#[test]
fn names_are_read_from_promql_and_matched_to_families() {
    assert_eq!(
        llmgw_names(
            r#"sum by (model) (rate(llmgw_requests_total{status=~"5.."}[5m])) / on() llmgw_leader{job="llmgw"}"#
        ),
        ["llmgw_leader", "llmgw_requests_total"]
            .map(String::from)
            .into()
    );
    let text = "# HELP llmgw_requests Requests.\n# TYPE llmgw_requests counter\n# TYPE llmgw_ttft_seconds histogram\n# TYPE llmgw_leader gauge\nllmgw_leader 1\n# TYPE llmgw_tokens_total counter\n# EOF\n";
    let have = exported(text);
    for name in [
        "llmgw_requests_total",
        "llmgw_ttft_seconds_bucket",
        "llmgw_ttft_seconds_count",
        "llmgw_leader",
        "llmgw_tokens_total",
    ] {
        assert!(have.contains(name), "{name}: {have:?}");
    }
    for name in [
        "llmgw_requests",
        "llmgw_ttft_seconds",
        "llmgw_tokens_total_total",
    ] {
        assert!(!have.contains(name), "{name}: {have:?}");
    }
}
