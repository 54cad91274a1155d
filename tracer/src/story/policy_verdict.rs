//! What a NetworkPolicy enforcer's rules say about a drop (JSON
//! `verdict.policy`), the nouns every enforcer's reader fills, and the
//! comments they read the rules by.

use serde::Serialize;

/// What a policy enforcer's rules say about a drop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PolicyVerdict {
    pub enforcer: Enforcer,
    pub direction: PolicyDirection,
    /// The pod the policies selected (`namespace/name`), as the rules name
    /// it or, when they do not, as podtrace knows the packet's pod.
    pub pod: Option<String>,
    /// The policies that selected the pod in that direction and that the
    /// packet went through, in order (profiles, for `no_profile_allowed`).
    pub policies: Vec<PolicyRef>,
    /// Calico's tier of the drop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    pub outcome: PolicyOutcome,
    /// kube-network-policies: the nfqueue its rules handed the packet to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<PolicyQueue>,
    /// What the API's NetworkPolicies say of the pod in that direction
    /// (`policy_api`): set once the story is told with its context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<ApiPolicies>,
}

/// The API's NetworkPolicies (networking.k8s.io/v1) that select the
/// dropped packet's pod in the verdict's direction, or why they are not
/// known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ApiPolicies {
    pub found_by: ApiFoundBy,
    /// One per pod and direction the verdict is about (two when the rules
    /// do not tell the direction: the source's egress and the
    /// destination's ingress).
    pub selections: Vec<PodSelection>,
    /// Policies the rules named that the API does not serve as such (a
    /// Calico kind, one deleted since), or whose podSelector does not
    /// select the pod by its labels now, each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unmatched: Vec<String>,
    /// Why the API's policies were not read (RBAC forbids the list, no
    /// API in this mode): `selections` is then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unread: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiFoundBy {
    /// The policies the enforcer's rules named, matched to the API's
    /// objects by name.
    KernelNames,
    /// Every policy of the pod's namespace evaluated on its labels: the
    /// kernel named none (kube-network-policies decides in userspace).
    Evaluated,
}

/// The policies that select one pod in one direction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PodSelection {
    /// `namespace/name`.
    pub pod: String,
    pub direction: PolicyDirection,
    pub policies: Vec<SelectingPolicy>,
    /// Policies select the pod in that direction and none has a rule for
    /// it: nothing is allowed.
    pub allows_nothing: bool,
}

/// One NetworkPolicy selecting the pod, as the API serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SelectingPolicy {
    /// `namespace/name`.
    pub name: String,
    /// Its podSelector as text (`app=db`, `tier in (a, b)`, `all pods`).
    pub pod_selector: String,
    /// `Ingress`, `Egress`, as the API says or defaults them.
    pub policy_types: Vec<String>,
    /// Its rules in that direction, in words (`from app=web on TCP/8080`).
    pub rules: Vec<String>,
    /// The ports those rules allow (`TCP/8080`, `TCP/8000-8090`, `UDP`
    /// for every UDP port, `any` for a rule without ports).
    pub ports: Vec<String>,
    /// The pod's labels the selector matched (`app=db`).
    pub pod_labels: Vec<String>,
}

/// The nfqueue a rule handed the packet to, as the rule says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PolicyQueue {
    pub number: u16,
    /// `flags bypass`: accepted, not dropped, when nothing reads the queue.
    pub bypass: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Enforcer {
    Calico,
    KubeRouter,
    KubeNetworkPolicies,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyDirection {
    Ingress,
    Egress,
    /// The rules do not tell which: kube-network-policies queues a packet
    /// whose source pod any policy selects, and its engine checks both
    /// that pod's egress and the destination's ingress.
    IngressOrEgress,
}

/// One policy (or Calico profile) and the chain it was rendered to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct PolicyRef {
    /// `KubernetesNetworkPolicy`, `NetworkPolicy`, `GlobalNetworkPolicy`,
    /// `Profile`, … as the enforcer names it.
    pub kind: String,
    /// `namespace/name`, or the name alone for a cluster-wide one.
    pub name: String,
    pub chain: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyOutcome {
    /// Policies selected the pod; none allowed the packet.
    NoPolicyAllowed,
    /// A deny rule of a policy matched the packet.
    DeniedByRule,
    /// No policy selected the pod; its profiles allowed nothing that
    /// matched (Calico).
    NoProfileAllowed,
    /// Queued to the enforcer's userspace engine, which dropped it: the
    /// kernel's evidence does not say which policy decided.
    DroppedByEngine,
    /// Queued to the enforcer's engine, and nothing took it from the
    /// queue (no engine running, or its queue full) while the queue has
    /// no bypass: the kernel dropped it, no policy decided.
    EngineUnreachable,
}

impl PolicyDirection {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
            Self::IngressOrEgress => "ingress or egress",
        }
    }
}

/// Every comment of a rule, in either syntax: iptables' `-m comment
/// --comment "…"` (one per match) and nft's `comment "…"` (one per rule;
/// Felix joins its hash and comments there with `; `).
pub(super) fn comments(rule: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = rule;
    while let Some(at) = rest.find("comment ") {
        rest = &rest[at + "comment ".len()..];
        // `-m comment --comment "…"`: the match's name, not its text.
        if rest.starts_with("--comment ") {
            continue;
        }
        let text = match rest.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"').unwrap_or(quoted.len());
                let text = &quoted[..end];
                rest = &quoted[(end + 1).min(quoted.len())..];
                text
            }
            None => {
                let end = rest.find(' ').unwrap_or(rest.len());
                let text = &rest[..end];
                rest = &rest[end..];
                text
            }
        };
        found.extend(
            text.split("; ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string),
        );
    }
    found
}
