"""Counts what the target's forward sees: the tokens of each `step` call (the loop's forward)."""


class StepSizes:
    """Tokens in each `step` call of the target (the loop's forward: logits plus hidden states)."""

    def __init__(self, model):
        self.model, self.sizes, step = model, [], model.step
        model.step = lambda tokens, *args, **kwargs: (self.sizes.append(tokens.shape[0]), step(tokens, *args, **kwargs))[1]

    def remove(self):
        del self.model.step
