"""stepplan.plots"""
