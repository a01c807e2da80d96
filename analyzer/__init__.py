"""The analyzer: time series in, findings and dollars out."""
