"""The one check of a saved ``state_dict()`` against the object loading it
(``Reader``, ``LMDBIterableDataset``, ``LMDBDataset``)."""


def check_state(state, mine, kind, positions=()):
    """Check `state` (a saved state_dict, perhaps through JSON) against
    `mine` (the loading object's own state_dict()): a dict with every field
    of `mine`, equal in each field but the `positions` (where the saved one
    stood), which must be integers >= 0.  Raises ValueError naming the field
    and the fix; returns the positions' values, in order."""
    if not isinstance(state, dict):
        raise ValueError('state must be a dict from state_dict(), not %s'
                         % type(state).__name__)
    for field in mine:
        if field not in state:
            raise ValueError('state: no field %r (is it the state_dict '
                             'of a %s?)' % (field, kind))
    for field in mine:
        if field in positions:
            continue
        theirs = state[field]
        if isinstance(theirs, tuple):
            theirs = list(theirs)
        if theirs != mine[field]:
            raise ValueError(
                'state field %r is %r, but this %s has %r: build it with the '
                'arguments and data of the saved one'
                % (field, state[field], kind, mine[field]))
    out = []
    for field in positions:
        try:
            value = int(state[field])
        except (TypeError, ValueError, OverflowError):
            raise ValueError('state field %r must be an integer, not %r'
                             % (field, state[field])) from None
        if value < 0:
            raise ValueError('state field %r must be >= 0, not %d'
                             % (field, value))
        out.append(value)
    return out
