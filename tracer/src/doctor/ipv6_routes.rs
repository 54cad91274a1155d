//! The node's IPv6 default routes, as `ip -6 route show default` lists
//! them.

/// A default route as `ip -6 route show default` prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefaultRoute6 {
    /// The line itself, for the evidence.
    pub line: String,
    pub dev: String,
    /// `proto ra`: learnt from a router advertisement.
    pub from_ra: bool,
}

impl DefaultRoute6 {
    /// The default routes of an `ip -6 route show default` listing; a
    /// multipath one gives one per `nexthop` line, with its parent's
    /// `proto`.
    pub fn parse(listing: &str) -> Vec<Self> {
        let mut routes = Vec::new();
        // The `default` line a `nexthop` line belongs to, and its proto.
        let mut parent: Option<(&str, bool)> = None;
        for line in listing.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let after = |key: &str| words.windows(2).find(|w| w[0] == key).map(|w| w[1]);
            let (whole, from_ra) = match (words.first(), parent) {
                (Some(&"default"), _) => {
                    let this = (line.trim(), after("proto") == Some("ra"));
                    parent = Some(this);
                    this
                }
                (Some(&"nexthop"), Some(this)) => this,
                _ => continue,
            };
            if let Some(dev) = after("dev") {
                routes.push(Self {
                    line: whole.to_string(),
                    dev: dev.to_string(),
                    from_ra,
                });
            }
        }
        routes
    }
}
