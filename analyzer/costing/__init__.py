"""Accounting and prices: where every GPU-hour went (accounting, the ledger), what a GPU costs (pricing) and what each job cost and wasted (cost)."""
