//! Turns finished journeys into output, up to the `--count` limit, and
//! feeds the `--profile` table.

use crate::{
    output::{Sink, Summary},
    story::{self, journey::Journey, profile::Profile, Context},
};

pub(super) struct Teller<'a> {
    pub sink: Box<dyn Sink + 'a>,
    pub ctx: Context,
    pub profile: Option<Profile>,
    pub limit: Option<u64>,
    pub told: u64,
}

impl Teller<'_> {
    fn limit_reached(&self) -> bool {
        self.limit.is_some_and(|n| self.told >= n)
    }

    /// Tells the journey's story; false once no more stories are wanted.
    pub fn tell(&mut self, journey: &Journey) -> std::io::Result<bool> {
        if self.limit_reached() {
            return Ok(false);
        }
        let story = story::tell(journey, &self.ctx);
        self.told += 1;
        self.sink.story(self.told, &story)?;
        if let Some(profile) = &mut self.profile {
            profile.add(&story);
        }
        Ok(!self.limit_reached())
    }

    pub fn finish(mut self, mut summary: Summary) -> std::io::Result<()> {
        if let Some(profile) = &self.profile {
            self.sink.profile(&profile.latencies())?;
        }
        summary.stories = self.told;
        self.sink.summary(&summary)
    }
}
