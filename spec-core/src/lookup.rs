//! Drafts copied from tokens already seen (prompt-lookup decoding, generalised): when the last
//! few committed tokens occurred before — earlier in the context, or in a reference such as an
//! answer guessed for a slightly different question — the tokens that followed them there are
//! the draft. A draft costs no forward, so on a CPU, where a draft model costs 40–60 % of a
//! target step, it pays whenever verifying it costs less than the tokens it is expected to add.

use crate::cost::{expected_tokens, AcceptanceRate, ForwardCosts};
use crate::draft::{DraftInput, TreeDraft, TreeDrafter};
use crate::tree::TokenTree;
use crate::{Error, Result};

/// Settings of a [`LookupDrafter`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LookupConfig {
    /// The longest suffix of the committed tokens looked up; shorter ones are tried after it.
    pub max_ngram: usize,
    /// The shortest suffix that may match.
    pub min_ngram: usize,
    /// Most tokens drafted per step.
    pub max_draft: usize,
}

impl Default for LookupConfig {
    fn default() -> Self {
        Self {
            max_ngram: 3,
            min_ngram: 1,
            max_draft: 8,
        }
    }
}

/// A [`TreeDrafter`] proposing a chain copied from where the committed tokens' suffix occurred
/// before: in the references (most recently added first), then earlier in the committed tokens
/// themselves (latest occurrence first); longer matches are preferred. Where nothing matches, a
/// guess the caller offered from the model's own last forward ([`LookupDrafter::offer_guess`])
/// is the draft. With forward costs, the draft is cut to the length that maximises expected
/// tokens per second at the acceptance rate observed so far for its kind (eq. 1 of Leviathan et
/// al. 2023 with a draft that costs nothing).
#[derive(Clone, Debug)]
pub struct LookupDrafter {
    config: LookupConfig,
    references: Vec<Vec<u32>>,
    costs: Option<ForwardCosts>,
    acceptance: AcceptanceRate,
    /// The guess or probe offered for the next call (its source `Guess` or `Probe`), and how
    /// often guesses were kept.
    offered: Option<(Vec<u32>, Source)>,
    guess_acceptance: AcceptanceRate,
    pending: Option<Pending>,
    drafted: usize,
    accepted: usize,
}

/// The last draft, the committed length it followed and where it came from: its outcome is
/// read from the next call's committed tokens.
#[derive(Clone, Debug)]
struct Pending {
    base: usize,
    draft: Vec<u32>,
    source: Source,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    Lookup,
    Guess,
    Probe,
}

impl LookupDrafter {
    pub fn new(config: LookupConfig) -> Result<Self> {
        if config.min_ngram == 0 || config.min_ngram > config.max_ngram || config.max_draft == 0 {
            return Err(Error::InvalidConfig(format!(
                "lookup drafts need 1 <= min_ngram <= max_ngram and max_draft >= 1, got {config:?}"
            )));
        }
        Ok(Self {
            config,
            references: Vec::new(),
            costs: None,
            // α = 0.5 with the weight of a few tokens; past steps weigh 0.9 per step.
            acceptance: AcceptanceRate::new(2.0, 2.0, 0.9),
            offered: None,
            // A guess past a rejected token is kept far less often: α = 0.1 to begin with, and
            // a long memory, so that a run of misses does not stop guessing for good (a guess
            // not drafted is not judged either).
            guess_acceptance: AcceptanceRate::new(1.0, 9.0, 0.99),
            pending: None,
            drafted: 0,
            accepted: 0,
        })
    }

    /// A drafter of at most `max_draft` tokens (the default n-grams) that goes on from earlier
    /// drafting: cut to what `costs` pay for when they are known, from the `acceptance` observed
    /// before when there was any.
    pub fn continuing(
        max_draft: usize,
        costs: Option<&ForwardCosts>,
        acceptance: Option<AcceptanceRate>,
    ) -> Result<Self> {
        let mut drafter = Self::new(LookupConfig {
            max_draft,
            ..LookupConfig::default()
        })?;
        drafter.costs = costs.cloned();
        if let Some(acceptance) = acceptance {
            drafter.acceptance = acceptance;
        }
        Ok(drafter)
    }

    /// Drafts only as many tokens as pay at the observed acceptance, given these costs.
    pub fn with_costs(mut self, costs: ForwardCosts) -> Self {
        self.costs = Some(costs);
        self
    }

    /// The acceptance estimate so far.
    pub fn acceptance(&self) -> AcceptanceRate {
        self.acceptance
    }

    /// The acceptance estimate of offered guesses so far.
    pub fn guess_acceptance(&self) -> AcceptanceRate {
        self.guess_acceptance
    }

    /// Starts from an acceptance of guesses observed before (a drafter per request that learns
    /// across requests).
    pub fn with_guess_acceptance(mut self, acceptance: AcceptanceRate) -> Self {
        self.guess_acceptance = acceptance;
        self
    }

    /// Offers the next call a guess of the tokens after the next one, drafted when no lookup
    /// matches and it pays: e.g. the model's argmax in its last forward at the positions past
    /// the token it kept, whose inputs were a rejected draft — one step of Jacobi iteration
    /// (Santilli et al. 2023), which a forward of two tokens costs little more than one. A
    /// guess serves one call.
    pub fn offer_guess(&mut self, guess: Vec<u32>) {
        self.offered = Some((guess, Source::Guess));
    }

    /// Offers the next call, where no guess is at hand, `token` as a probe: a token drafted
    /// when no lookup matches and guesses pay, only so that the forward yields a guess for the
    /// position after it (Jacobi iteration's starting guess, e.g. the next token repeated). A
    /// probe is not counted in the guesses' acceptance. It replaces an offered guess, as a
    /// guess replaces it.
    pub fn offer_probe(&mut self, token: u32) {
        self.offered = Some((vec![token], Source::Probe));
    }

    /// Adds a sequence to copy from (it is searched before earlier references).
    pub fn add_reference(&mut self, tokens: Vec<u32>) {
        if !tokens.is_empty() {
            self.references.push(tokens);
        }
    }

    /// Tokens drafted and accepted so far.
    pub fn counts(&self) -> (usize, usize) {
        (self.drafted, self.accepted)
    }

    /// The tokens that followed the longest matching suffix of `committed`, at most `max_len`.
    pub fn lookup(&self, committed: &[u32], max_len: usize) -> Vec<u32> {
        let LookupConfig {
            max_ngram,
            min_ngram,
            ..
        } = self.config;
        for n in (min_ngram..=max_ngram.min(committed.len())).rev() {
            let suffix = &committed[committed.len() - n..];
            let in_references = self
                .references
                .iter()
                .rev()
                .find_map(|r| continuation_after(r, suffix, r.len()));
            // In the committed tokens, an occurrence that ends before the suffix itself.
            let found = in_references
                .or_else(|| continuation_after(committed, suffix, committed.len() - 1));
            if let Some(draft) = found {
                return draft[..draft.len().min(max_len)].to_vec();
            }
        }
        Vec::new()
    }

    /// The draft length with the best expected tokens per second at `acceptance`, at most
    /// `available`.
    fn paying_length(&self, available: usize, acceptance: AcceptanceRate) -> usize {
        let Some(costs) = &self.costs else {
            return available;
        };
        let alpha = acceptance.rate();
        let rate = |gamma: usize| expected_tokens(gamma, alpha) / costs.cost(gamma + 1);
        (0..=available)
            .max_by(|&a, &b| rate(a).total_cmp(&rate(b)))
            .unwrap_or(0)
    }

    /// Reads how much of the last draft was kept from the tokens committed since.
    fn observe(&mut self, committed: &[u32]) {
        if let Some(Pending {
            base,
            draft,
            source,
        }) = self.pending.take()
        {
            let Some(after) = committed.get(base..) else {
                return;
            };
            let kept = draft.iter().zip(after).take_while(|(d, c)| d == c).count();
            match source {
                Source::Lookup => self.acceptance.observe(draft.len(), kept),
                Source::Guess => self.guess_acceptance.observe(draft.len(), kept),
                Source::Probe => {}
            }
            self.drafted += draft.len();
            self.accepted += kept;
        }
    }
}

/// The tokens after the latest occurrence of `suffix` in `tokens` that ends at or before `end`.
fn continuation_after<'a>(tokens: &'a [u32], suffix: &[u32], end: usize) -> Option<&'a [u32]> {
    let n = suffix.len();
    (n..=end.min(tokens.len()))
        .rev()
        .find(|&stop| &tokens[stop - n..stop] == suffix && stop < tokens.len())
        .map(|stop| &tokens[stop..])
}

impl TreeDrafter for LookupDrafter {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let (root, committed) = (input.root()?, input.committed);
        self.observe(committed);
        let most = input.max_depth.min(self.config.max_draft);
        let found = self.lookup(committed, most);
        let offered = self.offered.take();
        let (draft, source) = match &offered {
            _ if !found.is_empty() => (
                &found[..self.paying_length(found.len(), self.acceptance)],
                Source::Lookup,
            ),
            // Guesses and probes are cut by the guesses' acceptance.
            Some((tokens, source)) => {
                let tokens = &tokens[..tokens.len().min(most)];
                let paying = self.paying_length(tokens.len(), self.guess_acceptance);
                (&tokens[..paying], *source)
            }
            None => (&found[..], Source::Lookup), // empty: nothing to draft
        };
        if !draft.is_empty() {
            self.pending = Some(Pending {
                base: committed.len(),
                draft: draft.to_vec(),
                source,
            });
        }
        Ok(TreeDraft::new(TokenTree::linear(root, draft), 0))
    }

    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        self.observe(committed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter() -> LookupDrafter {
        LookupDrafter::new(LookupConfig::default()).unwrap()
    }

    #[test]
    fn copies_what_followed_the_longest_matching_suffix() {
        let d = drafter();
        // "5 6" occurred before, followed by 7 8 9; "6" alone also occurred after 2.
        let committed = [1, 2, 6, 3, 5, 6, 7, 8, 9, 4, 5, 6];
        assert_eq!(d.lookup(&committed, 8), vec![7, 8, 9, 4, 5, 6]);
        assert_eq!(d.lookup(&committed, 2), vec![7, 8]);
        // Nothing matches a token never seen before.
        assert!(d.lookup(&[1, 2, 3], 8).is_empty());
    }

    #[test]
    fn references_come_before_the_context_and_the_newest_first() {
        let mut d = drafter();
        d.add_reference(vec![9, 1, 2, 30, 31]);
        d.add_reference(vec![1, 2, 40, 41]);
        let committed = [1, 2, 50, 1, 2];
        assert_eq!(d.lookup(&committed, 8), vec![40, 41]);
        // A longer match in an older reference wins over a shorter one in a newer.
        let mut d = drafter();
        d.add_reference(vec![7, 1, 2, 30]);
        d.add_reference(vec![2, 40]);
        assert_eq!(d.lookup(&[7, 1, 2], 8), vec![30]);
    }

    #[test]
    fn learns_acceptance_and_stops_drafting_what_does_not_pay() {
        // A forward of k tokens costs k: no draft can pay unless every token is accepted.
        let costs = ForwardCosts::from_points(&[(1, 1.0), (16, 16.0)]).unwrap();
        let mut d = drafter().with_costs(costs);
        d.add_reference(vec![1, 2, 3, 4, 5]);
        let tree = d.draft_tree(DraftInput::new(&[1], 8)).unwrap().tree;
        assert_eq!(
            tree.len(),
            1,
            "at α = 0.5 and linear costs, drafting does not pay"
        );
        // Cheap verification (a batch costs what one token does): the whole match is drafted,
        // and its outcome is read from what was committed next.
        let costs = ForwardCosts::from_points(&[(1, 1.0), (16, 1.0)]).unwrap();
        let mut d = drafter().with_costs(costs);
        d.add_reference(vec![1, 2, 3, 4, 5]);
        let tree = d.draft_tree(DraftInput::new(&[1], 8)).unwrap().tree;
        assert_eq!(tree.len(), 5);
        d.draft_tree(DraftInput::new(&[1, 2, 3, 9], 8)).unwrap();
        assert_eq!(d.counts(), (4, 2));
        assert!(LookupDrafter::new(LookupConfig {
            min_ngram: 0,
            ..LookupConfig::default()
        })
        .is_err());
    }

    #[test]
    fn an_offered_guess_drafts_only_where_no_lookup_matches_and_learns_apart() {
        let mut d = drafter();
        d.add_reference(vec![1, 2, 3]);
        // A match wins over the guess, and the guess is gone after the call.
        d.offer_guess(vec![9]);
        assert_eq!(
            d.draft_tree(DraftInput::new(&[1], 8))
                .unwrap()
                .tree
                .tokens(),
            [1, 2, 3]
        );
        assert_eq!(
            d.draft_tree(DraftInput::new(&[1, 2, 3, 7], 8))
                .unwrap()
                .tree
                .tokens(),
            [7]
        );
        // No match: the guess is the draft, cut to the depth asked for.
        d.offer_guess(vec![5, 6]);
        assert_eq!(
            d.draft_tree(DraftInput::new(&[1, 2, 3, 7, 8], 1))
                .unwrap()
                .tree
                .tokens(),
            [8, 5]
        );
        let (lookups, guesses) = (d.acceptance().rate(), d.guess_acceptance().rate());
        // The guess was kept: only the guesses' estimate moves.
        d.finish(&[1, 2, 3, 7, 8, 5]).unwrap();
        assert_eq!(d.acceptance().rate(), lookups);
        assert!(d.guess_acceptance().rate() > guesses);
        // Where a forward of two tokens costs twice one, a guess never pays.
        let costs = ForwardCosts::from_points(&[(1, 1.0), (16, 16.0)]).unwrap();
        let mut d = drafter().with_costs(costs);
        d.offer_guess(vec![5]);
        assert_eq!(
            d.draft_tree(DraftInput::new(&[4], 8)).unwrap().tree.len(),
            1
        );
        // Where it costs 3 % more, a guess kept one time in ten does.
        let costs = ForwardCosts::from_points(&[(1, 1.0), (2, 1.03), (16, 3.0)]).unwrap();
        let mut d = drafter().with_costs(costs);
        d.offer_guess(vec![5]);
        assert_eq!(
            d.draft_tree(DraftInput::new(&[4], 8))
                .unwrap()
                .tree
                .tokens(),
            [4, 5]
        );
        // A probe is drafted where no guess is at hand, and its miss is not counted.
        let guesses = d.guess_acceptance();
        d.offer_probe(6);
        assert_eq!(
            d.draft_tree(DraftInput::new(&[4, 7], 8))
                .unwrap()
                .tree
                .tokens(),
            [7, 6]
        );
        d.finish(&[4, 7, 8]).unwrap();
        assert!(
            d.guess_acceptance().rate() < guesses.rate(),
            "the guess 5 missed"
        );
        let guesses = d.guess_acceptance();
        d.offer_probe(9);
        d.draft_tree(DraftInput::new(&[4, 7, 8], 8)).unwrap();
        d.finish(&[4, 7, 8, 1]).unwrap();
        assert_eq!(d.guess_acceptance(), guesses);
    }

    #[test]
    fn a_continuing_drafter_keeps_the_costs_and_acceptance_it_is_given() {
        // 16 tokens cost twice one: drafts pay at α = 0.5, not near 0.
        let cheap = ForwardCosts::from_points(&[(1, 1.0), (16, 2.0)]).unwrap();
        // An acceptance learned earlier as nearly zero: no draft pays.
        let mut poor = AcceptanceRate::new(2.0, 2.0, 0.9);
        for _ in 0..20 {
            poor.observe(8, 0);
        }
        let mut d = LookupDrafter::continuing(8, Some(&cheap), Some(poor)).unwrap();
        assert_eq!(d.acceptance(), poor);
        d.add_reference(vec![1, 2, 3, 4, 5]);
        assert_eq!(
            d.draft_tree(DraftInput::new(&[1], 8)).unwrap().tree.len(),
            1
        );
        // Without an earlier acceptance it starts fresh and drafts the whole match, at most
        // `max_draft` tokens.
        let mut d = LookupDrafter::continuing(3, Some(&cheap), None).unwrap();
        assert_eq!(d.acceptance(), drafter().acceptance());
        d.add_reference(vec![1, 2, 3, 4, 5]);
        assert_eq!(
            d.draft_tree(DraftInput::new(&[1], 8)).unwrap().tree.len(),
            4
        );
        assert!(LookupDrafter::continuing(0, None, None).is_err());
    }
}
