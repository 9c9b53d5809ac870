"""Copy probe variants (plugin: ``--plugin copy_variants`` with this folder on PYTHONPATH).

``copy-from1``: Copy trained on nominal lengths 1 .. n_train instead of the spec's n_train/2 .. n_train (the
seeds' 32 .. 64 at n_train 64, from seed 003's authors' code). Kazemnejad et al. (2023), whose Copy task seed 004
names, train on every length up to the training length; seed 004 does not say which range it used. Scoring is
Copy's own at n_train x m."""

from lengthbench.tasks import register_task
from lengthbench.tasks.copy import Copy


@register_task("copy-from1")
class CopyFromOne(Copy):
    """Copy, trained on nominal lengths 1 .. n_train."""

    def train_length_range(self, train_length: int) -> tuple[int, int]:
        return self.min_length(), train_length
