//! PodSecurity admission, as kube-apiserver's built-in plugin enforces
//! it on pod creation: the level a namespace's
//! `pod-security.kubernetes.io/enforce` label names (else the cluster's
//! default, privileged unless the stub was told otherwise,
//! [`super::Stub::set_pod_security_default`]), and a refusal worded as
//! the API words it (403 Forbidden, `pods "<name>" is forbidden: violates
//! PodSecurity "<level>:<version>": <reason> (<detail>), …`).
//!
//! The checks are those of the Pod Security Standards that a pod such as
//! podtrace's can fail, in the order the API reports them (baseline's
//! checks by their ID, then restricted's): capabilities, host namespaces,
//! hostPath volumes, privileged; and for restricted also
//! allowPrivilegeEscalation, capabilities' drop, volume types,
//! runAsNonRoot and seccompProfile. AppArmor, hostPorts, procMount,
//! SELinux, sysctls and Windows' hostProcess are not checked.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::{routes::Body, Shared};

const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
const ENFORCE_VERSION: &str = "pod-security.kubernetes.io/enforce-version";

/// The capabilities baseline lets a container add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The refusal of `pod`'s creation in `namespace`, if its level refuses it.
pub(crate) fn refuse_pod(shared: &Shared, namespace: &str, pod: &Value) -> Option<Response<Body>> {
    let (level, version) = level_of(shared, namespace);
    let violations = match level.as_str() {
        "baseline" => baseline(pod, true),
        "restricted" => [baseline(pod, false), restricted(pod)].concat(),
        _ => return None,
    };
    if violations.is_empty() {
        return None;
    }
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let detail: Vec<String> = violations
        .iter()
        .map(|(reason, detail)| format!("{reason} ({detail})"))
        .collect();
    Some(super::routes::status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "pods \"{name}\" is forbidden: violates PodSecurity \"{level}:{version}\": {}",
            detail.join(", ")
        ),
        json!({"name": name, "kind": "pods"}),
    ))
}

/// The namespace's enforced level and version, from its labels, else the
/// cluster's default.
fn level_of(shared: &Shared, namespace: &str) -> (String, String) {
    let state = shared.state.lock().unwrap();
    let labels = state
        .objects
        .get("namespaces")
        .and_then(|all| all.values().find(|n| n["metadata"]["name"] == namespace))
        .map(|n| n["metadata"]["labels"].clone())
        .unwrap_or_default();
    let level = labels[ENFORCE]
        .as_str()
        .or(state.pod_security_default.as_deref())
        .unwrap_or("privileged")
        .to_string();
    let version = labels[ENFORCE_VERSION].as_str().unwrap_or("latest");
    (level, version.to_string())
}

/// One failed check: its reason and detail, as the API says them.
type Violation = (&'static str, String);

/// The pod's containers (init containers first, as the API visits them).
fn containers(pod: &Value) -> Vec<&Value> {
    let spec = &pod["spec"];
    ["initContainers", "containers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        .collect()
}

fn name(container: &Value) -> String {
    container["name"].as_str().unwrap_or_default().to_string()
}

/// Baseline's checks (`capabilities`: its own capabilities check, which
/// restricted replaces with its stricter one).
fn baseline(pod: &Value, capabilities: bool) -> Vec<Violation> {
    let spec = &pod["spec"];
    let mut found = Vec::new();
    if capabilities {
        let (bad, caps) = adding(pod, |c| BASELINE_CAPABILITIES.contains(&c));
        if !bad.is_empty() {
            found.push(("non-default capabilities", must_not_add(&bad, &caps)));
        }
    }
    let host: Vec<&str> = ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|k| spec[*k] == true)
        .collect();
    if !host.is_empty() {
        let set: Vec<String> = host.iter().map(|k| format!("{k}=true")).collect();
        found.push(("host namespaces", set.join(", ")));
    }
    let host_paths = volumes(pod, "hostPath");
    if !host_paths.is_empty() {
        let what = plural(host_paths.len(), "volume", "volumes");
        found.push((
            "hostPath volumes",
            format!("{what} {}", join_quote(&host_paths)),
        ));
    }
    let privileged: Vec<String> = containers(pod)
        .into_iter()
        .filter(|c| c["securityContext"]["privileged"] == true)
        .map(name)
        .collect();
    if !privileged.is_empty() {
        found.push((
            "privileged",
            containers_must(&privileged, "must not set securityContext.privileged=true"),
        ));
    }
    found
}

/// Restricted's own checks, after baseline's.
fn restricted(pod: &Value) -> Vec<Violation> {
    let all = containers(pod);
    let mut found = Vec::new();
    let escalating: Vec<String> = all
        .iter()
        .filter(|c| c["securityContext"]["allowPrivilegeEscalation"] != false)
        .map(|c| name(c))
        .collect();
    if !escalating.is_empty() {
        found.push((
            "allowPrivilegeEscalation != false",
            containers_must(
                &escalating,
                "must set securityContext.allowPrivilegeEscalation=false",
            ),
        ));
    }
    found.extend(unrestricted_capabilities(pod));
    let host_paths = volumes(pod, "hostPath");
    if !host_paths.is_empty() {
        let n = host_paths.len();
        found.push((
            "restricted volume types",
            format!(
                "{} {} {} restricted volume type \"hostPath\"",
                plural(n, "volume", "volumes"),
                join_quote(&host_paths),
                plural(n, "uses", "use")
            ),
        ));
    }
    let pod_context = &pod["spec"]["securityContext"];
    let unset = |field: &str, ok: &dyn Fn(&Value) -> bool| -> Vec<String> {
        if ok(&pod_context[field]) {
            return Vec::new();
        }
        all.iter()
            .filter(|c| !ok(&c["securityContext"][field]))
            .map(|c| name(c))
            .collect()
    };
    let non_root = unset("runAsNonRoot", &|v| *v == true);
    if !non_root.is_empty() {
        found.push((
            "runAsNonRoot != true",
            format!(
                "pod or {}",
                containers_must(&non_root, "must set securityContext.runAsNonRoot=true")
            ),
        ));
    }
    let seccomp = unset("seccompProfile", &|v| {
        v["type"] == "RuntimeDefault" || v["type"] == "Localhost"
    });
    if !seccomp.is_empty() {
        found.push((
            "seccompProfile",
            format!(
                "pod or {}",
                containers_must(
                    &seccomp,
                    "must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\""
                )
            ),
        ));
    }
    found
}

/// Restricted's capabilities: every one dropped, none added but
/// NET_BIND_SERVICE.
fn unrestricted_capabilities(pod: &Value) -> Option<Violation> {
    let mut capabilities = Vec::new();
    let undropped: Vec<String> = containers(pod)
        .into_iter()
        .filter(|c| {
            let drop = c["securityContext"]["capabilities"]["drop"].as_array();
            !drop.into_iter().flatten().any(|d| d == "ALL")
        })
        .map(name)
        .collect();
    if !undropped.is_empty() {
        let what = "must set securityContext.capabilities.drop=[\"ALL\"]";
        capabilities.push(containers_must(&undropped, what));
    }
    let (bad, caps) = adding(pod, |c| c == "NET_BIND_SERVICE");
    if !bad.is_empty() {
        capabilities.push(must_not_add(&bad, &caps));
    }
    (!capabilities.is_empty()).then(|| ("unrestricted capabilities", capabilities.join("; ")))
}

/// The containers that add a capability `allowed` refuses, and those
/// capabilities (sorted, once each).
fn adding(pod: &Value, allowed: impl Fn(&str) -> bool) -> (Vec<String>, Vec<String>) {
    let mut bad = Vec::new();
    let mut caps = std::collections::BTreeSet::new();
    for c in containers(pod) {
        let add = c["securityContext"]["capabilities"]["add"].as_array();
        let refused: Vec<&str> = add
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|cap| !allowed(cap))
            .collect();
        if !refused.is_empty() {
            bad.push(name(c));
            caps.extend(refused.into_iter().map(String::from));
        }
    }
    (bad, caps.into_iter().collect())
}

/// The names of the pod's volumes of `kind` ("hostPath"), in spec order.
fn volumes(pod: &Value, kind: &str) -> Vec<String> {
    let all = pod["spec"]["volumes"].as_array().into_iter().flatten();
    all.filter(|v| v[kind].is_object())
        .filter_map(|v| v["name"].as_str().map(String::from))
        .collect()
}

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// The detail of a capabilities check that `bad` containers fail by
/// adding `caps`.
fn must_not_add(bad: &[String], caps: &[String]) -> String {
    let caps = join_quote(caps);
    containers_must(
        bad,
        &format!("must not include {caps} in securityContext.capabilities.add"),
    )
}

/// `container "a" <what>`, `containers "a", "b" <what>`.
fn containers_must(names: &[String], what: &str) -> String {
    let containers = plural(names.len(), "container", "containers");
    format!("{containers} {} {what}", join_quote(names))
}

/// `"a", "b"`, as the API quotes lists.
fn join_quote(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    quoted.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_like() -> Value {
        json!({"metadata": {"name": "p"}, "spec": {
            "hostNetwork": true, "hostPID": true,
            "containers": [{"name": "agent", "securityContext": {"capabilities": {
                "add": ["NET_ADMIN", "BPF", "CHOWN"], "drop": ["ALL"]}}}],
            "volumes": [{"name": "btf", "hostPath": {"path": "/sys/kernel/btf"}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "host", "hostPath": {"path": "/"}}]}})
    }

    fn said(found: Vec<Violation>) -> String {
        let parts: Vec<String> = found.iter().map(|(r, d)| format!("{r} ({d})")).collect();
        parts.join(", ")
    }

    #[test]
    fn baseline_says_what_the_api_says_in_its_order() {
        assert_eq!(
            said(baseline(&agent_like(), true)),
            "non-default capabilities (container \"agent\" must not include \"BPF\", \"NET_ADMIN\" in securityContext.capabilities.add), host namespaces (hostNetwork=true, hostPID=true), hostPath volumes (volumes \"btf\", \"host\")"
        );
        let plain = json!({"spec": {"containers": [{"name": "c"}]}});
        assert!(baseline(&plain, true).is_empty());
    }

    #[test]
    fn restricted_adds_its_own_checks_after_baselines() {
        let found = [baseline(&agent_like(), false), restricted(&agent_like())].concat();
        let reasons: Vec<&str> = found.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            reasons,
            [
                "host namespaces",
                "hostPath volumes",
                "allowPrivilegeEscalation != false",
                "unrestricted capabilities",
                "restricted volume types",
                "runAsNonRoot != true",
                "seccompProfile"
            ]
        );
        assert_eq!(
            found[4].1,
            "volumes \"btf\", \"host\" use restricted volume type \"hostPath\""
        );
    }
}
