"""stepplan.sim"""
