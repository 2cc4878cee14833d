"""One router per resource: findings, scores, costs (the /api), pages (/, /docs) and ops (/metrics, health)."""
