"""Learning routers in the serving simulator: Gymnasium env, demonstrations, BC, PPO, export."""
