"""What a run learns and carries forward: the skill library, and the operator mix with its bandit."""
