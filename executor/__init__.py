"""stepplan.executor"""
