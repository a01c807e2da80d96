"""The team dashboard: fleet, jobs, job detail, findings and cost, read through the analyzer."""
