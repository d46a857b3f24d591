"""Every state change as one transaction: placement, lifecycle, outcomes, leases, ... No HTTP here."""
