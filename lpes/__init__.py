from lpes.errors import LpesError

__all__ = ["LpesError"]
