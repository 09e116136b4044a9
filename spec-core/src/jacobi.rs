//! Jacobi decoding: greedy decoding that guesses a window of future tokens and refines the
//! guess by fixed-point iteration, S ← [S₀, argmax LLM(S)[0 : L−1]], committing each iteration
//! the prefix of the guess that the model reproduced (Santilli et al.; PredGen's alternative to
//! autoregressive continuation, seeded with the previous answer).
//!
//! Every committed token is the model's argmax given the committed tokens before it, so the
//! output is exactly that of greedy autoregressive decoding; what changes is how many forwards
//! produce it.

use crate::draft::{DraftInput, TreeDraft, TreeDrafter};
use crate::sampling::argmax;
use crate::tree::TokenTree;
use crate::verify::Verified;
use crate::{Error, Result};

/// Jacobi iteration as a drafter: each step drafts the guess for the next `window` positions
/// as a chain; after the verification the guess becomes the target's argmax at every position
/// past the accepted prefix (the fixed-point update), followed by the guesses the pass did not
/// reach. Costs no forward of its own; it reads every row of the verification, so it is
/// verified with [`Verification::Batched`](crate::Verification::Batched). Greedy decoding by
/// Jacobi iteration is [`speculate`](crate::speculate()) with this drafter and greedy
/// acceptance.
#[derive(Clone, Debug)]
pub struct JacobiDrafter {
    /// Guessed tokens for the positions after the last committed one; the first `window` are
    /// checked each pass, the rest wait their turn.
    guess: Vec<u32>,
    window: usize,
    /// How many guessed tokens the last tree carried.
    drafted: usize,
}

impl JacobiDrafter {
    /// A window of `window` guessed tokens starting from `initial_guess` (e.g. the rest of a
    /// previous answer; padded by repeating its last token when shorter than the window).
    pub fn new(initial_guess: &[u32], window: usize) -> Result<Self> {
        if window == 0 {
            return Err(Error::InvalidConfig(
                "the Jacobi window must be at least 1".into(),
            ));
        }
        Ok(Self {
            guess: initial_guess.to_vec(),
            window,
            drafted: 0,
        })
    }
}

impl TreeDrafter for JacobiDrafter {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let root = input.root()?;
        let width = self.window.min(input.max_depth);
        let pad = self
            .guess
            .iter()
            .take(width)
            .next_back()
            .copied()
            .unwrap_or(root);
        let mut draft: Vec<u32> = self.guess.iter().copied().take(width).collect();
        draft.resize(width, pad);
        self.drafted = width;
        Ok(TreeDraft::new(TokenTree::linear(root, &draft), 0))
    }

    fn observe(&mut self, tree: &TokenTree, verified: &Verified) -> Result<()> {
        let rows = verified.rows.as_ref().ok_or(Error::Unsupported(
            "Jacobi iteration reads every row of the verification: verify with Batched",
        ))?;
        // The row after node j predicts the token at node j + 1's position: past the accepted
        // prefix, the Jacobi update of the guess.
        let accepted = verified.verdict.path.len() - 1;
        let mut next: Vec<u32> = (accepted + 1..tree.len())
            .map(|node| argmax(rows.row(node)))
            .collect();
        next.extend(self.guess.iter().skip(self.drafted + 1).copied());
        self.guess = next;
        Ok(())
    }

    fn finish(&mut self, _committed: &[u32]) -> Result<()> {
        Ok(())
    }
}
