"""Local stand-ins for the outside world: a Stripe-shaped payments API, a shop, a mail sink.

The sandbox is an independent service. It imports nothing of Holdfast, keeps its records
in a database of its own (the ``sandbox`` alias) and is reached only over the network,
exactly like the providers it replaces.
"""
