//! `podtrace schema`: the JSON Schema of one `-o json` line, derived from
//! the structs serde writes (their serde attributes honoured: renames,
//! tags, flattening, fields left out when empty), so it cannot drift from
//! the output. docs/schema.json is this schema, checked by a test.

use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::json::Steps;
use crate::{
    model::{ProbeResult, Summary},
    story::Story,
};

/// The schema's version. Fields are only ever added within a version: a
/// field removed or renamed, or a value's type changed, bumps it.
pub const VERSION: u32 = 1;

/// One line of `-o json` as `output::Json` writes it: an object tagged by
/// `type`, then the value's own fields.
// Never built (so neither unused nor too large): it describes what
// `Json::line` writes, `type` first.
#[allow(dead_code, clippy::large_enum_variant)]
#[derive(JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line<'a> {
    /// One per packet told.
    Story(Story),
    /// With `--profile`, at exit: each hop-to-hop step's latency.
    Profile(Steps<'a>),
    /// With `--probe`, one per probe, after the stories.
    Probe(ProbeResult),
    /// One at exit.
    Summary(Summary),
}

/// The schema of one JSON line, its `$id` and title naming its version.
pub fn schema() -> Schema {
    let generator =
        SchemaGenerator::new(schemars::generate::SchemaSettings::draft2020_12().for_serialize());
    let mut schema = generator.into_root_schema_for::<Line>();
    schema.insert(
        "$id".into(),
        format!("urn:podtrace:json-line:v{VERSION}").into(),
    );
    schema.insert(
        "title".into(),
        format!("podtrace -o json line, schema version {VERSION}").into(),
    );
    schema.insert(
        "description".into(),
        format!(
            "One line of `podtrace -o json` (also `podtrace read -o json`), tagged by \
             `type`. Version {VERSION}: fields are only ever added; a field removed or \
             renamed, or a value whose type changes, bumps the version. Readers should \
             ignore fields they do not know."
        )
        .into(),
    );
    schema
}

/// The schema as `podtrace schema` prints it: pretty, one trailing newline.
pub fn text() -> String {
    let mut text = serde_json::to_string_pretty(&schema()).expect("a schema serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;
    use crate::{
        decode::hop::{DropInfo, KernelRoute},
        model::{Finding, Format, KernelSummary, NodeCounts},
        output::testing::Kept,
        story::{profile::Profile, tests::sample_story, Outcome},
    };

    /// Every property name the schema defines, anywhere in it.
    fn property_names(value: &Value, names: &mut BTreeSet<String>) {
        match value {
            Value::Object(object) => {
                if let Some(Value::Object(properties)) = object.get("properties") {
                    names.extend(properties.keys().cloned());
                }
                object.values().for_each(|v| property_names(v, names));
            }
            Value::Array(items) => items.iter().for_each(|v| property_names(v, names)),
            _ => {}
        }
    }

    /// Every key of a written line, at any depth.
    fn keys(value: &Value, found: &mut BTreeSet<String>) {
        match value {
            Value::Object(object) => {
                found.extend(object.keys().cloned());
                object.values().for_each(|v| keys(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| keys(v, found)),
            _ => {}
        }
    }

    /// Stories as the tests' flannel journey tells them, and the same
    /// story with each other ending and every optional part filled in.
    fn stories() -> Vec<crate::story::Story> {
        let told = sample_story();
        let drop = DropInfo {
            reason: "NETFILTER_DROP".into(),
            reason_from_location: true,
            location: "nf_hook_slow+0x9f".into(),
            by_socket: false,
        };
        let mut full = told.clone();
        full.hops[0].route = Some(KernelRoute {
            result: "success".into(),
            dev: Some("flannel.1".into()),
            via: Some("10.244.2.0".parse().unwrap()),
        });
        full.hops[1].clock_uncertainty_us = Some(11.0);
        full.freed_after_delivery = vec![drop.clone()];
        full.records_lost = true;
        full.verdict.outcome = Outcome::Dropped {
            node: "node-1".into(),
            iface: "cni0".into(),
            reason: drop.reason,
            location: drop.location,
        };
        full.verdict.netfilter_hook = Some("FORWARD".into());
        full.verdict.hint = Some("IP forwarding is off".into());
        full.verdict.doctor = vec![Finding {
            family: "kernel".into(),
            check: "ip_forward".into(),
            evidence: "net.ipv4.ip_forward = 0".into(),
            fix: None,
        }];
        let mut incomplete = told.clone();
        incomplete.verdict.outcome = Outcome::Incomplete {
            node: "node-1".into(),
            iface: "eth0".into(),
            direction: crate::decode::hop::Direction::Egress,
            cause: "the kernel lost 3 records: the ring buffer was full".into(),
        };
        let mut translated = told.clone();
        translated.verdict.outcome = Outcome::TranslatedOutOfSight {
            node: "node-1".into(),
            iface: "cni0".into(),
            direction: crate::decode::hop::Direction::Ingress,
            translation: "DNAT 10.96.0.10:53 → 10.244.2.2:53".into(),
            in_flight: true,
        };
        vec![told, full, incomplete, translated]
    }

    fn summary() -> Summary {
        let kernel = KernelSummary {
            release: "5.15.0".into(),
            degraded: vec!["clsact instead of TCX (needs 6.6)".into()],
        };
        Summary {
            sightings: 12,
            stories: 2,
            drops_elsewhere: 1,
            sample: 4,
            nodes: vec![NodeCounts {
                node: "node-1".into(),
                agent: "podtrace/podtrace-agent-x".into(),
                clock: Some("+3000000.0 µs ±11.0 µs".into()),
                kernel: Some(kernel.clone()),
                lost: Some("its pod was deleted".into()),
                ..Default::default()
            }],
            kernel: Some(kernel),
            untraced_nodes: vec!["node-3".into()],
            ..Default::default()
        }
    }

    /// What `-o json` writes for `stories()`, a profile, a probe and a
    /// summary, through the real sink.
    fn written_lines() -> Vec<Value> {
        let kept = Kept::default();
        let mut sink = super::super::sink(Format::Json, kept.clone(), false);
        let mut profile = Profile::default();
        for (n, story) in stories().iter().enumerate() {
            sink.story(n as u64 + 1, story).unwrap();
            profile.add(story);
        }
        sink.profile(&profile.latencies()).unwrap();
        sink.probe(&crate::model::ProbeResult {
            kind: "tcp:8080".into(),
            target: "10.244.2.2:8080".into(),
            seq: 1,
            answered: false,
            silent: true,
            rtt_ms: None,
            result: "no answer in 1 s".into(),
            flow_id: 40000,
        })
        .unwrap();
        sink.summary(&summary()).unwrap();
        let text = kept.text();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn every_kind_of_line_written_is_valid_under_the_schema() {
        let schema = serde_json::to_value(schema()).unwrap();
        let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
        let mut names = BTreeSet::new();
        property_names(&schema, &mut names);
        let lines = written_lines();
        let kinds: BTreeSet<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
        assert_eq!(
            kinds,
            BTreeSet::from(["story", "profile", "probe", "summary"])
        );
        for line in &lines {
            let errors: Vec<String> = validator
                .iter_errors(line)
                .map(|e| format!("{} at {}", e, e.instance_path()))
                .collect();
            assert!(errors.is_empty(), "{errors:?} in {line}");
            let mut found = BTreeSet::new();
            keys(line, &mut found);
            let unknown: Vec<&String> = found.difference(&names).collect();
            assert!(unknown.is_empty(), "{unknown:?} not in the schema: {line}");
        }
    }

    #[test]
    fn a_line_of_another_type_or_a_wrong_field_is_refused() {
        let schema = serde_json::to_value(schema()).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let lines = written_lines();
        let mut probe = lines.into_iter().find(|l| l["type"] == "probe").unwrap();
        assert!(validator.is_valid(&probe));
        probe["seq"] = "first".into();
        assert!(!validator.is_valid(&probe));
        probe["type"] = "trace".into();
        assert!(!validator.is_valid(&probe));
    }

    #[test]
    fn the_schema_names_its_version() {
        let schema = serde_json::to_value(schema()).unwrap();
        assert_eq!(schema["$id"], format!("urn:podtrace:json-line:v{VERSION}"));
        assert!(schema["description"]
            .as_str()
            .unwrap()
            .contains("fields are only ever added"));
    }
}
