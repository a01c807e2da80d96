"""The common grid: the tidy frames every source reads into, how long each sample stands for, and the dense (series x time) views every detector and the accounting share."""
