"""Pure data: identity, states, journal entries, fence observations, results. No I/O."""
