//! Prints the vCPU and interrupt-controller state of a snapshot (debugging
//! aid): `cargo run -p vmm --example snapdump -- DIR`.

use vmm::persist::SnapshotState;

fn lapic_reg(regs: &[std::os::raw::c_char], off: usize) -> u32 {
    let b: Vec<u8> = regs[off..off + 4]
        .iter()
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn main() -> anyhow::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect("DIR"));
    let st: SnapshotState = snapshot::load(&dir.join("state"))?;
    println!("vsock_had_connections={}", st.vsock_had_connections);
    println!("clock={:?}", st.vm.clock);
    for (i, v) in st.vcpus.iter().enumerate() {
        println!(
            "vcpu{i}: rip={:#x} rsp={:#x} rflags={:#x} cr3={:#x} mp_state={}",
            v.regs.rip, v.regs.rsp, v.regs.rflags, v.sregs.cr3, v.mp_state.mp_state
        );
        println!("  events={:?}", v.events);
        let r = &v.lapic.regs;
        for (name, off) in [
            ("id", 0x20),
            ("tpr", 0x80),
            ("svr", 0xf0),
            ("lvt_timer", 0x320),
            ("tmict", 0x380),
            ("tmcct", 0x390),
            ("tdcr", 0x3e0),
        ] {
            println!("  {name}={:#x}", lapic_reg(r, off));
        }
        for k in 0..8 {
            let isr = lapic_reg(r, 0x100 + k * 0x10);
            let irr = lapic_reg(r, 0x200 + k * 0x10);
            if isr != 0 || irr != 0 {
                println!("  isr[{k}]={isr:#x} irr[{k}]={irr:#x}");
            }
        }
        for (idx, val) in &v.msrs {
            if matches!(
                *idx,
                0x10 | 0x6e0 | 0x1b | 0x4b564d00..=0x4b564d08 | 0x11 | 0x12
            ) {
                println!("  msr {idx:#x}={val:#x}");
            }
        }
        println!("  tsc_khz={:?}", v.tsc_khz);
    }
    Ok(())
}
