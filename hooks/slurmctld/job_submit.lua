-- job_submit.lua for imexctl: multi-node jobs on IMEX partitions get whole trays.
--
-- imexctl sets up an IMEX domain only for a job that has its trays to itself; a job that may share
-- them runs without IMEX (docs/configuration.md "Exclusive jobs"). A partition with
-- OverSubscribe=EXCLUSIVE (26.05: Exclusive=NODE) is the simplest cure. Where a partition must stay
-- shared for one-tray jobs, this makes every multi-node job on it exclusive at submission, as if
-- submitted with --exclusive, or (IMEX_MODE = "reject") refuses it with a message to the user.
--
-- Install: slurm.conf  JobSubmitPlugins=lua  and this file as job_submit.lua beside slurm.conf on the
-- slurmctld host; edit the three settings below. Read with Slurm 22.05 to 26.05 (job_desc.shared,
-- min_nodes and partition: src/plugins/job_submit/lua/job_submit_lua.c). A job that gives no node
-- count (only -n) is left alone: Slurm decides its nodes later.

local IMEX_PARTITIONS = { gb200 = true }  -- the partitions of IMEX trays
local DEFAULT_PARTITION = "gb200"         -- the partition (Default=YES) a job without -p gets, or nil
local IMEX_MODE = "exclusive"             -- "exclusive" or "reject"

-- job_desc.shared (src/common/slurm_opt.c): 0 --exclusive, 1 --oversubscribe, 2 --exclusive=user,
-- 3 --exclusive=mcs, 4 --exclusive=topo (24.05+), slurm.NO_VAL16 when not given
local JOB_SHARED_NONE, JOB_SHARED_TOPO = 0, 4

local function imex_partition(job_desc)
	local parts = job_desc.partition or DEFAULT_PARTITION
	if parts == nil then
		return nil
	end
	for part in string.gmatch(parts, "[^,]+") do
		if IMEX_PARTITIONS[part] then
			return part
		end
	end
	return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local part = imex_partition(job_desc)
	local nodes = job_desc.min_nodes
	if part == nil or nodes == nil or nodes == slurm.NO_VAL or nodes < 2 then
		return slurm.SUCCESS
	end
	local shared = job_desc.shared
	if shared == JOB_SHARED_NONE or shared == JOB_SHARED_TOPO then
		return slurm.SUCCESS
	end
	if IMEX_MODE == "reject" then
		slurm.log_user("imexctl: a job of %d nodes on partition %s needs whole trays for IMEX: "
			.. "submit it with --exclusive", nodes, part)
		return slurm.ERROR
	end
	job_desc.shared = JOB_SHARED_NONE
	slurm.log_info("imexctl: a job of %d nodes from uid %d on partition %s made exclusive (IMEX)",
		nodes, submit_uid, part)
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end
