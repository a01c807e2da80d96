"""Fleet mode: the store's roll-ups for the whole fleet, per-GPU series only where a roll-up flags something, analysed in independent parts."""
