//! Agents lost mid-trace: a log that ended before the agent's summary
//! (the agent killed, its node gone) or broke off (the API lost). Said at
//! once; the packets that went on to its node after its last progress
//! mark are told incomplete, not vanished; and the run fails.

use std::time::{Instant, SystemTime};

use super::{arrivals::Held, stories_context, Session};
use crate::story::context::LostAgent;

impl Session {
    /// `node`'s log ended (`why`: how, when it broke off). Without the
    /// agent's summary first, the agent was lost: said at once, and the
    /// packets that went on to its node after its last progress mark are
    /// told incomplete, not vanished.
    pub(super) fn ended(&mut self, node: String, why: Option<String>) {
        let Some(agent) = self.agents.get_mut(&node) else {
            return;
        };
        agent.ended = true;
        if agent.start.is_none() {
            // Said as the run's error, by the wait for the agents' starts.
            agent.never_started = why;
        } else if agent.summary.is_some() {
            if let Some(why) = why {
                eprintln!("podtrace: {node}: {why}");
            }
        } else {
            let (what, since) = agent.lose(&node, why.as_deref(), SystemTime::now());
            // Its probes' results may never come: a run that ends with
            // its probes does not wait for them. (Without --probe the run
            // goes on with the agents left.)
            if self.probes_wanted > 0 {
                self.probes_done.get_or_insert_with(Instant::now);
            }
            eprintln!("podtrace: {what}: packets that went on to {node} are told incomplete");
            let placed = self.clocks.placements();
            let lost = LostAgent {
                since_ns: self.clocks.common_ns(&placed, &node, since),
                node: node.clone(),
                what,
            };
            if let Some(ctx) = stories_context(&mut self.teller, &mut self.ctx) {
                ctx.lost_agents.push(lost);
            }
        }
        self.arrivals.hold(Instant::now(), node, Held::Ended);
    }
}
