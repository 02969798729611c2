"""The returns math: V-trace and n-step returns, and V-trace over a train batch's units."""
